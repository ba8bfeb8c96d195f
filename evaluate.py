"""Evaluate a checkpoint: `python evaluate.py ckpt=PATH [out=metrics.json] [export=DIR] [ema=true] [data.root=...]`,
or the same under `torchrun --nproc_per_node=W` (the metrics do not depend on W)."""
import sys

import hydra
from omegaconf import DictConfig
from torch.distributed.elastic.multiprocessing.errors import record

from src.commands.evaluate import run
from src.config import refuse_renamed_groups


@hydra.main(config_path="conf", config_name="evaluate", version_base=None)
@record  # under torchrun: the exception and traceback go to the error file its summary prints
def main(cfg: DictConfig) -> None:
    """Hydra entry point: everything else happens in src.commands.evaluate.run."""
    run(cfg)


if __name__ == "__main__":
    refuse_renamed_groups(sys.argv[1:])
    main()
