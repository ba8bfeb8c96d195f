"""Detection's joint image + boxes transforms (torchvision.transforms.v2 with tv_tensors) and its TaskData.

A detection sample is `(image, {"boxes": tv_tensors.BoundingBoxes XYXY, "labels": int64 [K]})`; v2 moves the
boxes with every geometric transform and SanitizeBoundingBoxes drops the boxes (and their labels) that
became degenerate. No normalisation and no resizing here: torchvision's detection models normalise and
resize inside (GeneralizedRCNNTransform and its kin), so the pipelines end with float32 images in [0, 1].
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torchvision.transforms import v2

from src.data.config import DataConfig
from src.data.batch import collate_lists
from src.data.task_data import TaskData


class DetectionTransform:
    """Runs a v2 pipeline on (image, target dict); returns plain tensors (tv_tensor subclasses stripped).

    Output: image float32 [3, H, W] in [0, 1], target {"boxes": float32 [K, 4] XYXY, "labels": int64 [K]}
    (other keys of the target pass through untouched).
    """

    def __init__(self, pipeline: Callable[..., Any]) -> None:
        self.pipeline = pipeline

    def __call__(self, image: Any, target: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        image, target = self.pipeline(image, target)
        out = {k: (v.as_subclass(torch.Tensor) if isinstance(v, torch.Tensor) else v) for k, v in target.items()}
        return image.as_subclass(torch.Tensor), out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.pipeline!r})"


def _finish() -> list[Any]:
    # SanitizeBoundingBoxes finds the labels under target["labels"] and drops them with their boxes
    # (boxes under 1 pixel wide or high, or outside the image).
    return [v2.ToDtype(torch.float32, scale=True), v2.SanitizeBoundingBoxes()]


def detection_train_transform(cfg: DataConfig, on_device: bool = False) -> DetectionTransform:
    """Flip (data.hflip) and colour jitter (data.color_jitter > 0) under data.augment, then float32 in [0, 1].

    Cheap on purpose: random IoU crops and zoom-outs (SSD's) cost more than the small models they would feed,
    and scale jitter would be undone by the models' own resizing.
    """
    if on_device:
        raise ValueError("detection batches cannot finish on the device (data.device_transforms): they are lists "
                         "of images with their boxes; set data.device_transforms=false or auto")
    steps: list[Any] = [v2.ToImage()]
    if cfg.augment:
        if cfg.hflip:
            steps.append(v2.RandomHorizontalFlip())
        if cfg.color_jitter > 0:
            j = cfg.color_jitter
            steps.append(v2.ColorJitter(brightness=j, contrast=j, saturation=j))
    return DetectionTransform(v2.Compose(steps + _finish()))


def detection_eval_transform(cfg: DataConfig) -> DetectionTransform:
    """Each image as it is, as float32 in [0, 1] (the model resizes; its boxes come back in image pixels)."""
    return DetectionTransform(v2.Compose([v2.ToImage(), *_finish()]))


def detection_predict_transform(cfg: DataConfig) -> v2.Compose:
    """A new image of any size -> the model's input: float32 in [0, 1], at its own size (the model resizes)."""
    return v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])


DETECTION_DATA = TaskData("detection", train=detection_train_transform, eval=detection_eval_transform,
                          predict=detection_predict_transform, device_transforms=False, collate=collate_lists)
