"""The embedded multi-label set `shapes_multilabel`: the embedded scenes of several shapes per image (those of the
segmentation, detection and instance-segmentation sets), labelled with the kinds of shape they show; generated, no
files (src/data/datasets/shapes/drawing.py's make_instance_image).

A kind is present when one of its shapes shows at least MIN_VISIBLE_AREA pixels (the rule of the detection set's
boxes, src/data/datasets/shapes/datasets.py's visible_boxes): a shape hidden under later ones, or cut by the border
to a few pixels, does not count.
"""
from __future__ import annotations

import numpy as np
import torch
from torchvision import tv_tensors

from src.data.config import DataConfig
from src.data.datasets.shapes import drawing
from src.data.datasets.shapes.datasets import SceneOptions, ShapesDetection, visible_boxes
from src.data.registry import DATASETS, Splits


class ShapesMultiLabel(ShapesDetection):
    """(tv_tensors.Image uint8 [3, H, W], float32 [K] multi-hot: 1 for each kind present), K = num_shape_kinds.

    The scenes of ShapesSegmentation and ShapesDetection (the same images for the same arguments); the classes are
    the shape kinds, without a background.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.classes = list(drawing.SHAPE_NAMES[:self.num_shape_kinds])

    def _generate(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        img, owner, kinds = drawing.make_instance_image(
            self.seed, self.split, index, self.image_size, self.num_shape_kinds, self.min_shapes, self.max_shapes,
            self.variable_size, self.noise_std, self.radius_range, self.photometric_spread)
        _, labels = visible_boxes(owner, kinds)  # kind + 1 of each shape with enough visible pixels
        present = np.zeros(self.num_shape_kinds, dtype=np.float32)
        present[labels - 1] = 1.0
        return img, present

    def __getitem__(self, index: int) -> tuple[tv_tensors.Image, torch.Tensor]:
        img, present = self.raw(index)
        return tv_tensors.Image(torch.from_numpy(img).permute(2, 0, 1)), torch.from_numpy(present.copy())


def _check_shapes_multilabel(cfg: DataConfig) -> None:
    n = cfg.num_classes
    if n is not None and not 2 <= n <= drawing.MAX_CLASSES:
        raise ValueError(f"data.num_classes for shapes_multilabel must be in 2..{drawing.MAX_CLASSES} (the number of "
                         f"shape kinds), got {n}")
    if cfg.variable_val_size:  # whole images are classified: evaluation batches them at data.image_size
        raise ValueError("data.variable_val_size=true does not apply to shapes_multilabel, whose validation images "
                         "have data.image_size like its training images: set data.variable_val_size=false")


@DATASETS.register("shapes_multilabel", options=SceneOptions, task="multilabel", check=_check_shapes_multilabel)
def build_shapes_multilabel(cfg: DataConfig) -> Splits:
    """data.min_shapes..max_shapes shapes per image of data.num_classes kinds (null = 6); labels: the kinds shown."""
    kinds = cfg.num_classes or drawing.DEFAULT_CLASSIFICATION_KINDS
    common = dict(image_size=cfg.image_size, num_shape_kinds=kinds, min_shapes=cfg.min_shapes,
                  max_shapes=cfg.max_shapes, noise_std=cfg.noise_std, cache=cfg.cache,
                  radius_range=(cfg.min_shape_size, cfg.max_shape_size), photometric_spread=cfg.photometric_spread)
    train = ShapesMultiLabel(cfg.generator_seed, "train", cfg.train_size, **common)
    val = ShapesMultiLabel(cfg.generator_seed, "val", cfg.val_size, variable_size=cfg.variable_val_size, **common)
    return Splits(train, val, list(train.classes), val_same_size=not cfg.variable_val_size)
