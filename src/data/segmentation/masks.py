"""Segmentation samples in the data layer: the ignore label, and TensorPairs, which adapts torchvision's (PIL image,
PIL label map) datasets to (Image, Mask) tensors.

Every segmentation dataset returns (tv_tensors.Image uint8 [3, H, W], tv_tensors.Mask uint8 [H, W]) with
255 = ignore, so segmentation's joint transforms (src/tasks/segmentation/transforms.py) treat them all alike.
"""
from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset
from torchvision import tv_tensors

from src.data.transforms import to_image, to_mask

IGNORE_INDEX = 255  # the label of pixels no metric or loss counts (VOC's void border, Cityscapes' unlabelled)


class TensorPairs(Dataset):
    """(PIL image, PIL label map) -> (Image, Mask), optionally mapping labels through a lookup table."""

    def __init__(self, base: Dataset, lut: torch.Tensor | None = None) -> None:
        self.base = base
        self.lut = lut

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> tuple[tv_tensors.Image, tv_tensors.Mask]:
        image, mask = self.base[index]
        return to_image(image), to_mask(mask, self.lut)

    def __getattr__(self, name: str) -> Any:  # expose e.g. .images / .targets of the torchvision dataset
        if name in ("base", "lut"):
            raise AttributeError(name)
        return getattr(self.base, name)
