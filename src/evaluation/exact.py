"""Helpers the tasks' evaluators share to keep evaluation exact: the exactly-once check, a caller's own loss
function in float64, metric names made from class names."""
from __future__ import annotations

import re
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


def metric_name(class_name: str) -> str:
    """A class name made safe for a metric key / TensorBoard tag ("traffic light" -> "traffic_light")."""
    return re.sub(r"[^0-9A-Za-z_.-]+", "_", class_name.strip()) or "unnamed"
