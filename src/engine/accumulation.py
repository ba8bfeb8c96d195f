"""Gradient accumulation windows: which micro-batches synchronise, and how each loss is scaled.

An epoch of n micro-batches is cut into windows of K from its start; the last window may be shorter
(m = n mod K). Within a window the first size-1 backward passes run under DDP's `no_sync()` (gradients
only accumulate locally) and the last one all-reduces, so there is exactly one gradient all-reduce per
optimizer step. Each micro-batch loss is scaled by 1/size of its own window, so a short last window
averages over the micro-batches it really has instead of being shrunk by m/K.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import ContextManager

import torch


@dataclass(frozen=True)
class MicroStep:
    """Where micro-batch `index` sits in its accumulation window."""

    index: int
    window_size: int
    is_last_in_window: bool

    @property
    def loss_scale(self) -> float:
        """Factor applied to this micro-batch's mean loss: 1 / window size."""
        return 1.0 / self.window_size


def micro_step(index: int, num_micro_batches: int, accum_steps: int) -> MicroStep:
    """Window position of micro-batch `index` (0-based within the epoch) for K = accum_steps."""
    if not 0 <= index < num_micro_batches:
        raise IndexError(f"micro-batch {index} outside an epoch of {num_micro_batches}")
    start = index - index % accum_steps
    size = min(accum_steps, num_micro_batches - start)
    return MicroStep(index, size, index == start + size - 1)


def optimizer_steps_per_epoch(num_micro_batches: int, accum_steps: int) -> int:
    """Optimizer steps in an epoch of `num_micro_batches` (the short last window counts as one)."""
    return -(-num_micro_batches // accum_steps)


def gradient_sync(model: torch.nn.Module, sync: bool) -> ContextManager:
    """DDP's no_sync() when this backward must not all-reduce; a no-op for a plain (one-process) module."""
    if sync or not hasattr(model, "no_sync"):
        return contextlib.nullcontext()
    return model.no_sync()
