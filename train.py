"""Train a model: `python train.py [overrides]` (one process) or `torchrun --nproc_per_node=W train.py`."""
import hydra
from omegaconf import DictConfig

from src.commands.command_line import check_command_line
from src.commands.user_errors import reported


@hydra.main(config_path="conf", config_name="train", version_base=None)
@reported  # a UserError: one message, exit code 2; any other error keeps its traceback (and torchrun's error file)
def main(cfg: DictConfig) -> None:
    """Hydra entry point: everything else happens in src.commands.train.run."""
    from src.commands.train import run  # here: a mistake on the command line is said before torch loads

    run(cfg)


if __name__ == "__main__":
    check_command_line("train", schema_module="src.commands.train")  # before Hydra: unknown keys, "did you mean"
    main()
