"""Train a model: `python train.py [overrides]` (one process) or `torchrun --nproc_per_node=W train.py`."""
import hydra
from omegaconf import DictConfig
from torch.distributed.elastic.multiprocessing.errors import record

import src.config  # noqa: F401  (registers the structured-config schema used by conf/train.yaml)
from src.commands.train import run


@hydra.main(config_path="conf", config_name="train", version_base=None)
@record  # under torchrun: the exception and traceback go to the error file its summary prints
def main(cfg: DictConfig) -> None:
    """Hydra entry point: everything else happens in src.commands.train.run."""
    run(cfg)


if __name__ == "__main__":
    main()
