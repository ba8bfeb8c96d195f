"""Predict new images: `python predict.py ckpt=PATH input=DIR_OR_FILE out=DIR [topk=5] [ema=true]`, or the
same under `torchrun --nproc_per_node=W` (each image is predicted once, whatever W)."""
import sys

import hydra
from omegaconf import DictConfig
from torch.distributed.elastic.multiprocessing.errors import record

from src.commands.predict import run  # registers the config schema conf/predict.yaml starts from
from src.config import refuse_renamed_groups


@hydra.main(config_path="conf", config_name="predict", version_base=None)
@record  # under torchrun: the exception and traceback go to the error file its summary prints
def main(cfg: DictConfig) -> None:
    """Hydra entry point: everything else happens in src.commands.predict.run."""
    run(cfg)


if __name__ == "__main__":
    refuse_renamed_groups(sys.argv[1:])
    main()
