"""Helpers the tasks' evaluators share: the exactly-once check and a caller's own loss function."""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from src.data.samplers import check_each_index_once


def custom_loss(loss_fn: Callable[[Any, Any], torch.Tensor], outputs: Any, targets: Any) -> torch.Tensor:
    """loss_fn's output in float64: unreduced values, or a 0-dim batch mean (then exact only up to rounding)."""
    return loss_fn(outputs, targets).double()


def check_each_sample_once(indices: torch.Tensor, expected: Optional[int]) -> None:
    """Raise when a sample was evaluated twice or skipped: the metrics would not be exact."""
    check_each_index_once(indices.tolist(), expected, "validation samples",
                          "build the loader with src.data.build_eval_loader (not a padding DistributedSampler)")
