"""The embedded classification set `shapes`: generated, no files (src/data/datasets/shapes/drawing.py draws it)."""
from __future__ import annotations

from src.data.config import DataConfig
from src.data.datasets.shapes import drawing
from src.data.datasets.shapes.datasets import ShapesClassification
from src.data.registry import DATASETS, Splits


def _check_shapes(cfg: DataConfig) -> None:
    n = cfg.num_classes
    if n is not None and not 2 <= n <= drawing.MAX_CLASSES:
        raise ValueError(f"data.num_classes for shapes must be in 2..{drawing.MAX_CLASSES} "
                         f"(the number of shape kinds), got {n}")


@DATASETS.register("shapes", task="classification", check=_check_shapes)
def build_shapes(cfg: DataConfig) -> Splits:
    """One dominant shape per image, label = its kind; data.num_classes kinds (null = 6)."""
    k = cfg.num_classes or drawing.DEFAULT_CLASSIFICATION_KINDS
    common = dict(image_size=cfg.image_size, num_classes=k, noise_std=cfg.noise_std, cache=cfg.cache,
                  photometric_spread=cfg.photometric_spread)
    train = ShapesClassification(cfg.generator_seed, "train", cfg.train_size, **common)
    val = ShapesClassification(cfg.generator_seed, "val", cfg.val_size, **common)
    return Splits(train, val, list(train.classes))
