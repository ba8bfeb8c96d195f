"""The embedded detection set `shapes_det`: the shapes_seg scenes with one box and class per visible shape."""
from __future__ import annotations

from src.data import shapes
from src.data import det_transforms  # noqa: F401  (registers the detection task's TaskData)
from src.data.config import DataConfig
from src.data.registry import DATASETS, Splits
from src.data.shapes_datasets import ShapesDetection


def _check_shapes_det(cfg: DataConfig) -> None:
    n = cfg.num_classes
    if n is not None and not 3 <= n <= shapes.MAX_CLASSES + 1:
        raise ValueError(f"data.num_classes for shapes_det must be in 3..{shapes.MAX_CLASSES + 1} "
                         f"(background + 2..{shapes.MAX_CLASSES} shape kinds), got {n}")


@DATASETS.register("shapes_det", task="detection", check=_check_shapes_det)
def build_shapes_det(cfg: DataConfig) -> Splits:
    """data.min_shapes..max_shapes shapes per image; data.num_classes counts the background (kinds + 1)."""
    kinds = (cfg.num_classes or shapes.DEFAULT_SEGMENTATION_KINDS + 1) - 1
    common = dict(image_size=cfg.image_size, num_shape_kinds=kinds, min_shapes=cfg.min_shapes,
                  max_shapes=cfg.max_shapes, noise_std=cfg.noise_std, cache=cfg.cache,
                  radius_range=(cfg.min_shape_size, cfg.max_shape_size), photometric_spread=cfg.photometric_spread)
    train = ShapesDetection(cfg.generator_seed, "train", cfg.train_size, **common)
    val = ShapesDetection(cfg.generator_seed, "val", cfg.val_size, variable_size=cfg.variable_val_size, **common)
    return Splits(train, val, list(train.classes), val_same_size=not cfg.variable_val_size)
