"""Export a trained model: `python export.py ckpt=PATH format=onnx|exported_program|torchscript out=FILE`."""
import hydra
from omegaconf import DictConfig

import src.config  # noqa: F401  (registers the training schema the stored config is validated against)
from src.commands.export import run


@hydra.main(config_path="conf", config_name="export", version_base=None)
def main(cfg: DictConfig) -> None:
    """Hydra entry point: everything else happens in src.commands.export.run."""
    run(cfg)


if __name__ == "__main__":
    main()
