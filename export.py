"""Export a trained model: `python export.py ckpt=PATH format=onnx|exported_program|torchscript out=FILE`."""
import hydra
from omegaconf import DictConfig

from src.commands.command_line import check_command_line
from src.commands.user_errors import reported


@hydra.main(config_path="conf", config_name="export", version_base=None)
@reported  # a UserError: one message, exit code 2; any other error keeps its traceback
def main(cfg: DictConfig) -> None:
    """Hydra entry point: everything else happens in src.commands.export.run."""
    from src.commands.export import run  # here: a mistake on the command line is said before torch loads

    run(cfg)


if __name__ == "__main__":
    check_command_line("export")  # before Hydra: unknown keys, "did you mean"
    main()
