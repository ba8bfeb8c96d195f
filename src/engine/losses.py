"""Training losses: classification cross-entropy (label smoothing, soft MixUp targets) and segmentation CE."""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from src.engine.amp import upcast

Loss = Callable[[Any, torch.Tensor], torch.Tensor]


def classification_loss(label_smoothing: float = 0.0) -> Loss:
    """Cross-entropy on logits [N, K]; targets are class indices or (MixUp/CutMix) probabilities [N, K].

    Computed in float32 at least (float64 logits stay float64), soft targets in the logits' dtype.
    """

    def loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = upcast(logits)
        if target.is_floating_point():
            target = target.to(logits.dtype)
        return F.cross_entropy(logits, target, label_smoothing=label_smoothing)

    return loss


def segmentation_loss(ignore_index: int = 255, aux_weight: float = 0.0) -> Loss:
    """Per-pixel CE ignoring `ignore_index`, plus aux_weight x CE of the auxiliary head when present.

    The mean is over the labelled pixels of the micro-batch (F.cross_entropy's convention).
    """

    def loss(outputs: dict[str, torch.Tensor], target: torch.Tensor) -> torch.Tensor:
        total = F.cross_entropy(upcast(outputs["out"]), target, ignore_index=ignore_index)
        if aux_weight > 0 and "aux" in outputs:
            total = total + aux_weight * F.cross_entropy(upcast(outputs["aux"]), target, ignore_index=ignore_index)
        return total

    return loss


def build_loss(task: str, label_smoothing: float, ignore_index: int, aux_weight: float) -> Loss:
    """The training loss for `task`."""
    if task == "classification":
        return classification_loss(label_smoothing)
    return segmentation_loss(ignore_index, aux_weight)
