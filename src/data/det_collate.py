"""Batches of detection samples: lists, because images may differ in size and each has its own number of boxes.

torchvision's detection models take exactly this: a list of [3, H, W] images and a list of target dicts.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch


def detection_collate(batch: Sequence[tuple[torch.Tensor, dict[str, Any]]]
                      ) -> tuple[list[torch.Tensor], list[dict[str, Any]]]:
    """[(image, target), ...] -> (images, targets), two lists in batch order."""
    return [sample[0] for sample in batch], [sample[1] for sample in batch]


def detection_collate_indexed(batch: Sequence[tuple[torch.Tensor, dict[str, Any], int]]
                              ) -> tuple[list[torch.Tensor], list[dict[str, Any]], torch.Tensor]:
    """[(image, target, index), ...] (IndexedDataset's samples) -> (images, targets, indices int64 [B])."""
    indices = torch.tensor([int(sample[2]) for sample in batch], dtype=torch.int64)
    return [sample[0] for sample in batch], [sample[1] for sample in batch], indices
