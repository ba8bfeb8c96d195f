"""Evaluate a checkpoint: `python evaluate.py ckpt=PATH [out=metrics.json] [export=DIR] [ema=true] [data.root=...]`,
or the same under `torchrun --nproc_per_node=W` (the metrics do not depend on W)."""
import hydra
from omegaconf import DictConfig
from torch.distributed.elastic.multiprocessing.errors import record

import src.config  # noqa: F401  (registers the training schema the stored config is validated against)
from src.commands.evaluate import run


@hydra.main(config_path="conf", config_name="evaluate", version_base=None)
@record  # under torchrun: the exception and traceback go to the error file its summary prints
def main(cfg: DictConfig) -> None:
    """Hydra entry point: everything else happens in src.commands.evaluate.run."""
    run(cfg)


if __name__ == "__main__":
    main()
