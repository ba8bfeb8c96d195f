"""Train a model: `python train.py [overrides]` (one process) or `torchrun --nproc_per_node=W train.py`."""
import sys

import hydra
from omegaconf import DictConfig
from torch.distributed.elastic.multiprocessing.errors import record

from src.commands.train import run  # registers the config schema conf/train.yaml starts from
from src.config import refuse_renamed_groups


@hydra.main(config_path="conf", config_name="train", version_base=None)
@record  # under torchrun: the exception and traceback go to the error file its summary prints
def main(cfg: DictConfig) -> None:
    """Hydra entry point: everything else happens in src.commands.train.run."""
    run(cfg)


if __name__ == "__main__":
    refuse_renamed_groups(sys.argv[1:])
    main()
