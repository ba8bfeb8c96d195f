"""What evaluation asks of a task: an evaluation forward and a fresh evaluator per evaluation, given an EvalContext.

The tasks implement it (src/tasks/base.py's Task does, and each task's evaluator); the loop (src/evaluation/loop.py)
calls only these members, so evaluation sits below the tasks and never imports them.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

import torch
from torch import nn


@dataclass
class EvalContext:
    """What an evaluator may need to know about the run and the data."""

    num_classes: int
    device: torch.device
    dataset_size: Optional[int]  # None when the loader's dataset has no len(): the each-once check is then partial
    class_names: Optional[list[str]] = None
    # `loss_fn(outputs, targets)`: unreduced losses (or a 0-dim mean) instead of the task's own loss.
    loss_fn: Optional[Callable[[Any, Any], torch.Tensor]] = None
    export: Optional[Path] = None  # write predictions in dataset order here (docs/evaluation.md)


class Evaluator(Protocol):
    """Accumulates one rank's shard without communicating, then computes the metrics of all ranks together."""

    def process(self, outputs: Any, targets: Any, indices: torch.Tensor) -> None:
        """One batch: the model's eval outputs, the targets, the dataset indices of its samples (CPU int64)."""

    def compute(self) -> dict[str, float]:
        """The metrics over every rank's samples, the same dict on every rank (call on every rank)."""


class EvaluatedTask(Protocol):
    """The members of a task (src/tasks/base.py's Task) that the evaluation loop calls."""

    def eval_forward(self, module: nn.Module, images: Any) -> Any:
        """The evaluation-mode forward of a batch's images."""

    def evaluator(self, context: EvalContext) -> Evaluator:
        """A fresh accumulator for one evaluation."""
