"""The embedded detection set `shapes_det`: the shapes_seg scenes with one box and class per visible shape."""
from __future__ import annotations

from src.data.config import DataConfig
from src.data.datasets.shapes.datasets import SceneOptions, ShapesDetection, check_scene_classes, scene_splits
from src.data.registry import DATASETS, Splits


def _check_shapes_det(cfg: DataConfig) -> None:
    check_scene_classes("shapes_det", cfg.num_classes)


@DATASETS.register("shapes_det", options=SceneOptions, task="detection", check=_check_shapes_det)
def build_shapes_det(cfg: DataConfig) -> Splits:
    """data.min_shapes..max_shapes shapes per image; data.num_classes counts the background (kinds + 1)."""
    train, val, same_size = scene_splits(cfg, ShapesDetection)
    return Splits(train, val, list(train.classes), val_same_size=same_size)
