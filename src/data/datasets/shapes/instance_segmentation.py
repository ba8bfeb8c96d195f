"""The embedded instance-segmentation set `shapes_inst`: the shapes_seg scenes by instance, one mask (its visible
pixels), box and class per visible shape; generated, no files (src/data/datasets/shapes/drawing.py's
make_instance_image)."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torchvision import tv_tensors

from src.data.config import DataConfig
from src.data.datasets.shapes import drawing
from src.data.datasets.shapes.datasets import (MIN_VISIBLE_AREA, SceneOptions, ShapesDetection,
                                               check_scene_classes, scene_splits, visible_boxes)
from src.data.registry import DATASETS, Splits


class ShapesInstances(ShapesDetection):
    """(tv_tensors.Image uint8 [3, H, W], {"boxes": BoundingBoxes XYXY float32 [K, 4], "labels": int64 [K],
    "masks": tv_tensors.Mask uint8 [K, H, W]}).

    The scenes of ShapesSegmentation and ShapesDetection (the same images, boxes and labels for the same
    arguments, which are ShapesDetection's): mask k holds the visible pixels of the k-th shape with at least
    MIN_VISIBLE_AREA of them (later shapes lie on top, so masks never overlap), box k is their tight box, label k
    its kind + 1.
    """

    def _generate(self, index: int) -> tuple[np.ndarray, Any]:
        # The cache keeps the owner map (one byte per pixel) and the kept shapes' ids, not K full masks.
        img, owner, kinds = drawing.make_instance_image(
            self.seed, self.split, index, self.image_size, self.num_shape_kinds, self.min_shapes, self.max_shapes,
            self.variable_size, self.noise_std, self.radius_range, self.photometric_spread)
        kept = np.asarray([j for j in range(1, len(kinds) + 1) if int((owner == j).sum()) >= MIN_VISIBLE_AREA],
                          dtype=np.int64)
        return img, (owner, kept, *visible_boxes(owner, kinds))

    def __getitem__(self, index: int) -> tuple[tv_tensors.Image, dict[str, torch.Tensor]]:
        img, (owner, kept, boxes, labels) = self.raw(index)
        h, w = img.shape[:2]
        masks = (owner[None] == kept[:, None, None].astype(owner.dtype)).astype(np.uint8)
        target = {"boxes": tv_tensors.BoundingBoxes(torch.from_numpy(boxes.copy()), format="XYXY", canvas_size=(h, w)),
                  "labels": torch.from_numpy(labels.copy()),
                  "masks": tv_tensors.Mask(torch.from_numpy(masks.reshape(len(kept), h, w)))}
        return tv_tensors.Image(torch.from_numpy(img).permute(2, 0, 1)), target


def _check_shapes_inst(cfg: DataConfig) -> None:
    check_scene_classes("shapes_inst", cfg.num_classes)


@DATASETS.register("shapes_inst", options=SceneOptions, task="instance_segmentation", check=_check_shapes_inst)
def build_shapes_inst(cfg: DataConfig) -> Splits:
    """data.min_shapes..max_shapes shapes per image; data.num_classes counts the background (kinds + 1)."""
    train, val, same_size = scene_splits(cfg, ShapesInstances)
    return Splits(train, val, list(train.classes), val_same_size=same_size)
