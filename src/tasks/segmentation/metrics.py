"""Segmentation metrics: a confusion matrix and the miou, pixel_acc and per-class IoU it gives.

Conventions (docs/evaluation.md repeats them):
- miou, pixel_acc and iou_<class> are in 0-1, so "0.80 mIoU" reads naturally.
- Absent classes: a class whose union is zero (it appears neither in the ground truth nor in the
  predictions of any evaluated pixel) has an undefined IoU. Its `iou_<class>` is NaN and it is excluded
  from the mean, as torchvision's references, mmseg and the Cityscapes scripts do. A class that is in the
  ground truth but never predicted, or predicted but never in the ground truth, has IoU 0 and counts.
- Pixels labelled `ignore_index` (255) are dropped before counting.
"""
from __future__ import annotations

import math

import torch

from src.evaluation.exact import metric_name


def confusion_matrix(
    preds: torch.Tensor, targets: torch.Tensor, num_classes: int, ignore_index: int = 255
) -> torch.Tensor:
    """Confusion matrix [K, K] (int64, rows = ground truth, columns = prediction) of one batch.

    Pixels equal to `ignore_index` are dropped. Any other label outside [0, K) is an error rather than
    being dropped silently: it means the dataset's label mapping is wrong.
    """
    if preds.shape != targets.shape:
        raise ValueError(f"preds {tuple(preds.shape)} and targets {tuple(targets.shape)} must have the same shape")
    t = targets.reshape(-1).long()
    p = preds.reshape(-1).long()
    keep = t != ignore_index
    t, p = t[keep], p[keep]
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= num_classes):
        bad = torch.unique(t[(t < 0) | (t >= num_classes)])[:10].tolist()
        raise ValueError(
            f"target labels {bad} are outside [0, {num_classes}) and are not the ignore index {ignore_index}; "
            "fix the dataset's label mapping or data.num_classes"
        )
    if p.numel() and (int(p.min()) < 0 or int(p.max()) >= num_classes):
        raise ValueError(f"predicted labels outside [0, {num_classes}): the model has the wrong number of classes")
    # bincount on the flattened (target, prediction) pair is one pass and exact in int64.
    counts = torch.bincount(t * num_classes + p, minlength=num_classes * num_classes)
    return counts.view(num_classes, num_classes)


class ConfusionMatrix:
    """Accumulates a [K, K] int64 confusion matrix and turns it into miou, pixel_acc and per-class IoU."""

    def __init__(self, num_classes: int, ignore_index: int = 255, device: torch.device | str = "cpu") -> None:
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self.mat = torch.zeros(num_classes, num_classes, dtype=torch.int64, device=device)

    def update(self, preds: torch.Tensor, targets: torch.Tensor) -> None:
        """Add one batch of predicted and ground-truth label maps (same shape)."""
        self.mat += confusion_matrix(preds.to(self.mat.device), targets.to(self.mat.device),
                                     self.num_classes, self.ignore_index)

    def iou(self) -> torch.Tensor:
        """Per-class IoU [K] in float64; NaN where the class's union is zero (absent everywhere)."""
        m = self.mat.double()
        tp = m.diag()
        union = m.sum(0) + m.sum(1) - tp
        return torch.where(union > 0, tp / union.clamp(min=1), torch.full_like(tp, math.nan))

    def miou(self) -> float:
        """Mean IoU over classes with a non-zero union (0-1); NaN when nothing was counted."""
        iou = self.iou()
        present = ~iou.isnan()
        return float(iou[present].mean()) if bool(present.any()) else math.nan

    def pixel_acc(self) -> float:
        """Fraction of counted (non-ignored) pixels predicted correctly (0-1); NaN when none counted."""
        total = int(self.mat.sum())
        return float(self.mat.diag().sum()) / total if total else math.nan

    def compute(self, class_names: list[str] | None = None) -> dict[str, float]:
        """{"miou", "pixel_acc", "iou_<name>" for every class} (0-1; NaN for absent classes)."""
        names = class_names if class_names is not None else [str(i) for i in range(self.num_classes)]
        if len(names) != self.num_classes:
            raise ValueError(f"{len(names)} class names given for {self.num_classes} classes")
        out = {"miou": self.miou(), "pixel_acc": self.pixel_acc()}
        for name, value in zip(names, self.iou().tolist()):
            out[f"iou_{metric_name(name)}"] = value
        return out
