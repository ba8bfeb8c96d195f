"""Segmentation's joint image + mask transforms (torchvision.transforms.v2 with tv_tensors) and its TaskData.

v2 dispatches on the tv_tensor type: masks are resized with nearest neighbour, colour jitter and
normalisation leave them alone, and padding fills them with the ignore index.
"""
from __future__ import annotations

from typing import Any

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2

from src.data.config import DataConfig
from src.data.segmentation.masks import IGNORE_INDEX
from src.data.task_data import TaskData
from src.data.transforms import PairTransform, normalize


class _MaskToLong(v2.Transform):
    """uint8 mask -> int64, the dtype cross_entropy wants; images pass through."""

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        if isinstance(inpt, tv_tensors.Mask):
            return tv_tensors.wrap(inpt.to(torch.int64), like=inpt)
        return inpt


def segmentation_train_transform(cfg: DataConfig, on_device: bool = False) -> PairTransform:
    """Random scale of the shorter side, crop padded with 0 / ignore, flip, optional colour jitter, normalise.

    `on_device` (data.device_transforms): uint8 images, normalised on the device; masks as always (int64).
    """
    steps: list[Any] = []
    if cfg.augment:
        base = cfg.base_size or cfg.crop_size
        lo, hi = max(1, int(cfg.scale_min * base)), max(1, int(cfg.scale_max * base))
        if hi > lo:
            # v2.RandomResize draws the shorter side uniformly in [lo, hi): the references' random scale.
            steps.append(v2.RandomResize(lo, hi + 1, antialias=True))
        else:
            steps.append(v2.Resize(lo, antialias=True))
        steps.append(v2.RandomCrop(cfg.crop_size, pad_if_needed=True,
                                   fill={tv_tensors.Image: 0, tv_tensors.Mask: IGNORE_INDEX}))
        if cfg.hflip:
            steps.append(v2.RandomHorizontalFlip())
        if cfg.color_jitter > 0:
            j = cfg.color_jitter
            steps.append(v2.ColorJitter(brightness=j, contrast=j, saturation=j))
    return PairTransform(v2.Compose(steps + ([] if on_device else normalize(cfg)) + [_MaskToLong()]))


def segmentation_eval_transform(cfg: DataConfig) -> PairTransform:
    """Each image at its own size: only normalisation (metrics are computed against the original mask)."""
    return PairTransform(v2.Compose(normalize(cfg) + [_MaskToLong()]))


def segmentation_predict_transform(cfg: DataConfig) -> v2.Compose:
    """A new image (PIL or array) of any size -> the model's input at that size: what evaluation does to images."""
    return v2.Compose([v2.ToImage(), *normalize(cfg)])


SEGMENTATION_DATA = TaskData("segmentation", train=segmentation_train_transform, eval=segmentation_eval_transform,
                             predict=segmentation_predict_transform)
