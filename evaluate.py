"""Evaluate a checkpoint: `python evaluate.py ckpt=PATH [out=metrics.json] [export=DIR] [ema=true] [data.root=...]`,
or the same under `torchrun --nproc_per_node=W` (the metrics do not depend on W)."""
import hydra
from omegaconf import DictConfig

from src.commands.command_line import check_command_line
from src.commands.user_errors import reported


@hydra.main(config_path="conf", config_name="evaluate", version_base=None)
@reported  # a UserError: one message, exit code 2; any other error keeps its traceback (and torchrun's error file)
def main(cfg: DictConfig) -> None:
    """Hydra entry point: everything else happens in src.commands.evaluate.run."""
    from src.commands.evaluate import run  # here: a mistake on the command line is said before torch loads

    run(cfg)


if __name__ == "__main__":
    check_command_line("evaluate")  # before Hydra: unknown keys, "did you mean"
    main()
