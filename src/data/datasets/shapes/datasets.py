"""torch Datasets over the procedural shapes generator, with an optional per-process image cache."""
from __future__ import annotations

from dataclasses import dataclass

from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision import tv_tensors

from src.data.datasets.shapes import drawing


class _CachedShapes(Dataset):
    """Common indexing and caching: generated samples are kept as uint8 arrays on first access.

    The cache lives in this process; DataLoader workers each fill their own copy (a 10k x 32x32 set is
    30 MB), and are cheap to refill because generation is well under a millisecond per image.
    """

    def __init__(self, seed: int, split: str, length: int, cache: bool) -> None:
        if split not in drawing.SPLITS:
            raise ValueError(f"split must be one of {sorted(drawing.SPLITS)}, got {split!r}")
        self.seed, self.split, self.length, self.cache = int(seed), split, int(length), cache
        self._store: dict[int, tuple[np.ndarray, Any]] = {}

    def __len__(self) -> int:
        return self.length

    def raw(self, index: int) -> tuple[np.ndarray, Any]:
        """The generated (uint8 HxWx3 image, target) of `index`, from the cache when possible."""
        if not 0 <= index < self.length:
            raise IndexError(f"index {index} out of range for a {self.split} split of {self.length} images")
        hit = self._store.get(index)
        if hit is None:
            hit = self._generate(index)
            if self.cache:
                self._store[index] = hit
        return hit

    def _generate(self, index: int) -> tuple[np.ndarray, Any]:
        raise NotImplementedError


class ShapesClassification(_CachedShapes):
    """(tv_tensors.Image uint8 [3, S, S], label) with one dominant shape per image."""

    def __init__(self, seed: int, split: str, length: int, image_size: int, num_classes: int,
                 noise_std: float = 10.0, cache: bool = True, photometric_spread: float = 0.0) -> None:
        super().__init__(seed, split, length, cache)
        drawing.check_num_classes(num_classes)
        self.image_size, self.num_classes, self.noise_std = image_size, num_classes, noise_std
        self.photometric_spread = photometric_spread
        self.classes = list(drawing.SHAPE_NAMES[:num_classes])

    def _generate(self, index: int) -> tuple[np.ndarray, int]:
        return drawing.make_classification_image(self.seed, self.split, index, self.image_size,
                                                self.num_classes, self.noise_std, self.photometric_spread)

    @property
    def targets(self) -> list[int]:
        """Labels without generating images (classes cycle through the indices)."""
        return [drawing.classification_label(i, self.num_classes) for i in range(self.length)]

    def __getitem__(self, index: int) -> tuple[tv_tensors.Image, int]:
        img, label = self.raw(index)
        return tv_tensors.Image(torch.from_numpy(img).permute(2, 0, 1)), label


class ShapesSegmentation(_CachedShapes):
    """(tv_tensors.Image uint8 [3, H, W], tv_tensors.Mask uint8 [H, W]); 0 = background, k = kind k-1."""

    def __init__(self, seed: int, split: str, length: int, image_size: int, num_shape_kinds: int,
                 min_shapes: int = 2, max_shapes: int = 4, variable_size: bool = False,
                 noise_std: float = 10.0, cache: bool = True,
                 radius_range: tuple[float, float] = (0.2, 0.34), photometric_spread: float = 0.0) -> None:
        super().__init__(seed, split, length, cache)
        self.photometric_spread = photometric_spread
        drawing.check_num_classes(num_shape_kinds)
        self.radius_range = (float(radius_range[0]), float(radius_range[1]))
        self.image_size, self.num_shape_kinds = image_size, num_shape_kinds
        self.min_shapes, self.max_shapes = min_shapes, max_shapes
        self.variable_size, self.noise_std = variable_size, noise_std
        self.classes = ["background"] + list(drawing.SHAPE_NAMES[:num_shape_kinds])

    def _generate(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        return drawing.make_segmentation_image(self.seed, self.split, index, self.image_size, self.num_shape_kinds,
                                              self.min_shapes, self.max_shapes, self.variable_size, self.noise_std,
                                              self.radius_range, self.photometric_spread)

    def __getitem__(self, index: int) -> tuple[tv_tensors.Image, tv_tensors.Mask]:
        img, mask = self.raw(index)
        return tv_tensors.Image(torch.from_numpy(img).permute(2, 0, 1)), tv_tensors.Mask(torch.from_numpy(mask))


# Shapes with fewer visible pixels than this (hidden by later shapes or cut by the border) get no box: a few
# pixels of a shape cannot tell its kind, and a detector should not be asked to find them.
MIN_VISIBLE_AREA = 16


def visible_boxes(owner: np.ndarray, kinds: list[int],
                  min_area: int = MIN_VISIBLE_AREA) -> tuple[np.ndarray, np.ndarray]:
    """Tight boxes of each shape's visible pixels (owner == j) and their labels (kind + 1).

    Boxes are float32 [K, 4] XYXY in pixel units with x2, y2 exclusive (a shape covering columns 3..7 has
    x1 = 3, x2 = 8), so x2 - x1 is the width in pixels; labels are int64 [K]. Shapes with fewer than
    `min_area` visible pixels are left out, so K <= len(kinds).
    """
    boxes, labels = [], []
    for j, kind in enumerate(kinds, start=1):
        visible = owner == j
        if int(visible.sum()) < min_area:
            continue
        rows = np.flatnonzero(visible.any(axis=1))
        cols = np.flatnonzero(visible.any(axis=0))
        boxes.append((cols[0], rows[0], cols[-1] + 1, rows[-1] + 1))
        labels.append(kind + 1)
    return (np.asarray(boxes, dtype=np.float32).reshape(-1, 4), np.asarray(labels, dtype=np.int64))


class ShapesDetection(_CachedShapes):
    """(tv_tensors.Image uint8 [3, H, W], {"boxes": BoundingBoxes XYXY float32 [K, 4], "labels": int64 [K]}).

    The scenes of ShapesSegmentation (the same images for the same arguments), with one box per visible
    shape: labels are kind + 1 (0 is the background, as in the segmentation masks).
    """

    def __init__(self, seed: int, split: str, length: int, image_size: int, num_shape_kinds: int,
                 min_shapes: int = 2, max_shapes: int = 4, variable_size: bool = False,
                 noise_std: float = 10.0, cache: bool = True,
                 radius_range: tuple[float, float] = (0.2, 0.34), photometric_spread: float = 0.0) -> None:
        super().__init__(seed, split, length, cache)
        drawing.check_num_classes(num_shape_kinds)
        self.image_size, self.num_shape_kinds = image_size, num_shape_kinds
        self.min_shapes, self.max_shapes = min_shapes, max_shapes
        self.variable_size, self.noise_std = variable_size, noise_std
        self.radius_range = (float(radius_range[0]), float(radius_range[1]))
        self.photometric_spread = photometric_spread
        self.classes = ["background"] + list(drawing.SHAPE_NAMES[:num_shape_kinds])

    def _generate(self, index: int) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
        # Only the image and the boxes are kept (the cache's share): the owner map is not needed afterwards.
        img, owner, kinds = drawing.make_instance_image(
            self.seed, self.split, index, self.image_size, self.num_shape_kinds, self.min_shapes, self.max_shapes,
            self.variable_size, self.noise_std, self.radius_range, self.photometric_spread)
        return img, visible_boxes(owner, kinds)

    def __getitem__(self, index: int) -> tuple[tv_tensors.Image, dict[str, torch.Tensor]]:
        img, (boxes, labels) = self.raw(index)
        h, w = img.shape[:2]
        target = {"boxes": tv_tensors.BoundingBoxes(torch.from_numpy(boxes.copy()), format="XYXY", canvas_size=(h, w)),
                  "labels": torch.from_numpy(labels.copy())}
        return tv_tensors.Image(torch.from_numpy(img).permute(2, 0, 1)), target


def check_scene_classes(name: str, num_classes: int | None) -> None:
    """data.num_classes of a several-shapes set (shapes_seg, shapes_det): background + 2..MAX_CLASSES kinds."""
    if num_classes is not None and not 3 <= num_classes <= drawing.MAX_CLASSES + 1:
        raise ValueError(f"data.num_classes for {name} must be in 3..{drawing.MAX_CLASSES + 1} "
                         f"(background + 2..{drawing.MAX_CLASSES} shape kinds), got {num_classes}")


@dataclass
class SceneOptions:
    """The `data` keys of the several-shapes sets: the datasets built on these scenes register it
    (`DATASETS.register(..., options=SceneOptions)`)."""

    min_shapes: int = 2  # shapes per image, drawn in [min_shapes, max_shapes]
    max_shapes: int = 4
    min_shape_size: float = 0.2  # shape radius range, as a fraction of the image's shorter side
    max_shape_size: float = 0.34
    variable_val_size: bool = False  # validation images of varying sizes (0.75..1.25 x image_size)

    def validate(self) -> None:
        """Raise ValueError naming the bad key."""
        if not 1 <= self.min_shapes <= self.max_shapes:
            raise ValueError(f"data.min_shapes and data.max_shapes must satisfy 1 <= min_shapes <= max_shapes, "
                             f"got {self.min_shapes} and {self.max_shapes}")
        if not 0.02 <= self.min_shape_size <= self.max_shape_size <= 0.5:
            raise ValueError(f"data.min_shape_size and data.max_shape_size must satisfy "
                             f"0.02 <= min_shape_size <= max_shape_size <= 0.5, got {self.min_shape_size} "
                             f"and {self.max_shape_size}")


def scene_splits(cfg: Any, scenes: type) -> tuple[Dataset, Dataset, bool]:
    """The train and val sets of a several-shapes dataset class (ShapesSegmentation, ShapesDetection) from the data
    config, and whether every val image has one size. data.num_classes counts the background (kinds + 1)."""
    kinds = (cfg.num_classes or drawing.DEFAULT_SEGMENTATION_KINDS + 1) - 1
    common = dict(image_size=cfg.image_size, num_shape_kinds=kinds, min_shapes=cfg.min_shapes,
                  max_shapes=cfg.max_shapes, noise_std=cfg.noise_std, cache=cfg.cache,
                  radius_range=(cfg.min_shape_size, cfg.max_shape_size), photometric_spread=cfg.photometric_spread)
    train = scenes(cfg.generator_seed, "train", cfg.train_size, **common)
    val = scenes(cfg.generator_seed, "val", cfg.val_size, variable_size=cfg.variable_val_size, **common)
    return train, val, not cfg.variable_val_size
