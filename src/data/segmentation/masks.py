"""Segmentation samples in the data layer: the ignore label, and TensorPairs, (image file, label map file) pairs as
(Image, Mask) tensors, for torchvision's segmentation sets.

Every segmentation dataset returns (tv_tensors.Image uint8 [3, H, W], tv_tensors.Mask uint8 [H, W]) with
255 = ignore, so segmentation's joint transforms (src/tasks/segmentation/transforms.py) treat them all alike.
torchvision's VOC and Cityscapes classes find the files; reading them here (src/data/image_files.py) makes a
corrupt file an error that names it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
from torch.utils.data import Dataset
from torchvision import tv_tensors

from src.data.image_files import load_mask, load_rgb
from src.data.transforms import to_image, to_mask

IGNORE_INDEX = 255  # the label of pixels no metric or loss counts (VOC's void border, Cityscapes' unlabelled)


class TensorPairs(Dataset):
    """images[i] read as RGB and masks[i] as class indices, optionally mapped through a lookup table."""

    def __init__(self, images: Sequence[str | Path], masks: Sequence[str | Path],
                 lut: torch.Tensor | None = None) -> None:
        if len(images) != len(masks):
            raise ValueError(f"{len(images)} images but {len(masks)} label maps")
        self.images, self.masks = list(images), list(masks)
        self.lut = lut

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[tv_tensors.Image, tv_tensors.Mask]:
        image = load_rgb(self.images[index])
        return to_image(image), to_mask(torch.from_numpy(load_mask(self.masks[index])), self.lut)
