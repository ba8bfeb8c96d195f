"""Export a trained model: `python export.py ckpt=PATH format=onnx|exported_program|torchscript out=FILE`."""
import sys

import hydra
from omegaconf import DictConfig

from src.commands.export import run
from src.config import refuse_renamed_groups


@hydra.main(config_path="conf", config_name="export", version_base=None)
def main(cfg: DictConfig) -> None:
    """Hydra entry point: everything else happens in src.commands.export.run."""
    run(cfg)


if __name__ == "__main__":
    refuse_renamed_groups(sys.argv[1:])
    main()
