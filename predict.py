"""Predict new images: `python predict.py ckpt=PATH input=DIR_OR_FILE out=DIR [topk=5] [ema=true]`, or the
same under `torchrun --nproc_per_node=W` (each image is predicted once, whatever W)."""
import hydra
from omegaconf import DictConfig
from torch.distributed.elastic.multiprocessing.errors import record

import src.config  # noqa: F401  (registers the training schema the stored config is validated against)
from src.commands.predict import run


@hydra.main(config_path="conf", config_name="predict", version_base=None)
@record  # under torchrun: the exception and traceback go to the error file its summary prints
def main(cfg: DictConfig) -> None:
    """Hydra entry point: everything else happens in src.commands.predict.run."""
    run(cfg)


if __name__ == "__main__":
    main()
