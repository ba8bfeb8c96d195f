"""Predict new images: `python predict.py ckpt=PATH input=DIR_OR_FILE out=DIR [topk=5] [ema=true]`, or the
same under `torchrun --nproc_per_node=W` (each image is predicted once, whatever W)."""
import hydra
from omegaconf import DictConfig

from src.commands.command_line import check_command_line
from src.commands.user_errors import reported


@hydra.main(config_path="conf", config_name="predict", version_base=None)
@reported  # a UserError: one message, exit code 2; any other error keeps its traceback (and torchrun's error file)
def main(cfg: DictConfig) -> None:
    """Hydra entry point: everything else happens in src.commands.predict.run."""
    from src.commands.predict import run  # here: a mistake on the command line is said before torch loads

    run(cfg)


if __name__ == "__main__":
    # src.commands.predict registers predict_schema (its keys and each task's), which Hydra composes onto.
    check_command_line("predict", schema_module="src.commands.predict")
    main()
