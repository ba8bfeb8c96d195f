"""The embedded segmentation set `shapes_seg`: several shapes per image and their per-pixel mask, generated, no
files (src/data/datasets/shapes/datasets.py)."""
from __future__ import annotations

from src.data.config import DataConfig
from src.data.datasets.shapes.datasets import SceneOptions, ShapesSegmentation, check_scene_classes, scene_splits
from src.data.registry import DATASETS, Splits


def _check_shapes_seg(cfg: DataConfig) -> None:
    check_scene_classes("shapes_seg", cfg.num_classes)


@DATASETS.register("shapes_seg", options=SceneOptions, task="segmentation", check=_check_shapes_seg)
def build_shapes_seg(cfg: DataConfig) -> Splits:
    """Several shapes per image; data.num_classes counts the background (so kinds = num_classes - 1)."""
    train, val, same_size = scene_splits(cfg, ShapesSegmentation)
    return Splits(train, val, list(train.classes), val_same_size=same_size)
