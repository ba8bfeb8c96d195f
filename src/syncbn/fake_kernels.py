"""Fake (meta) implementations of the eight SyncBN kernel ops, so torch.compile can trace them.

The C++ side (csrc/bindings.cpp) registers the ops under a per-variant namespace with their schemas
and CPU/CUDA kernels; these functions tell FakeTensor what each op returns (shape, dtype, device,
strides) without running it. They must agree exactly with the kernels' outputs, as csrc/ops.h states
them: torch.library.opcheck compares the two in tests/syncbn/test_custom_ops.py.
"""
from __future__ import annotations

from typing import Optional

import torch

OP_NAMES = (
    "batch_norm_stats",
    "batch_norm_gather_stats",
    "batch_norm_mean_sums",
    "batch_norm_deviation_sums",
    "batch_norm_reduced_stats",
    "batch_norm_elemt",
    "batch_norm_backward_reduce",
    "batch_norm_backward_elemt",
)

_REGISTERED: set[str] = set()


def _acc_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _stats(input: torch.Tensor) -> torch.Tensor:
    # [count, mean(C), M2(C)] in float64, whatever the input dtype.
    return input.new_empty((2 * input.shape[1] + 1,), dtype=torch.float64)


def _gather_stats(
    gathered: torch.Tensor,
    running_mean: Optional[torch.Tensor],
    running_var: Optional[torch.Tensor],
    num_batches_tracked: Optional[torch.Tensor],
    momentum: float,
    eps: float,
    acc_double: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # The running statistics are updated in place (declared in the schema); nothing to fake for them.
    channels = (gathered.shape[1] - 1) // 2
    acc = torch.float64 if acc_double else torch.float32
    mean = gathered.new_empty((channels,), dtype=acc)
    invstd = gathered.new_empty((channels,), dtype=acc)
    count = gathered.new_empty((), dtype=torch.float64)
    return mean, invstd, count


def _mean_sums(stats: torch.Tensor) -> torch.Tensor:
    # [count, sum n*mean(C)]
    return stats.new_empty(((stats.numel() + 1) // 2,), dtype=torch.float64)


def _deviation_sums(stats: torch.Tensor, mean_sums: torch.Tensor) -> torch.Tensor:
    return stats.new_empty(((stats.numel() - 1) // 2,), dtype=torch.float64)


def _reduced_stats(
    mean_sums: torch.Tensor,
    m2: torch.Tensor,
    running_mean: Optional[torch.Tensor],
    running_var: Optional[torch.Tensor],
    num_batches_tracked: Optional[torch.Tensor],
    momentum: float,
    eps: float,
    acc_double: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    acc = torch.float64 if acc_double else torch.float32
    return m2.new_empty(m2.shape, dtype=acc), m2.new_empty(m2.shape, dtype=acc), m2.new_empty((), dtype=torch.float64)


def _elemt(
    input: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    mean: torch.Tensor,
    invstd: torch.Tensor,
) -> torch.Tensor:
    # The kernels take dense input only, and give y exactly its strides (empty_like preserves them).
    return torch.empty_like(input)


def _backward_reduce(
    grad_out: torch.Tensor, input: torch.Tensor, mean: torch.Tensor, invstd: torch.Tensor
) -> torch.Tensor:
    return input.new_empty((2 * input.shape[1],), dtype=_acc_dtype(input))


def _backward_elemt(
    grad_out: torch.Tensor,
    input: torch.Tensor,
    mean: torch.Tensor,
    invstd: torch.Tensor,
    weight: Optional[torch.Tensor],
    reduced: torch.Tensor,
    count: torch.Tensor,
) -> torch.Tensor:
    return torch.empty_like(input)


_FAKES = {
    "batch_norm_stats": _stats,
    "batch_norm_gather_stats": _gather_stats,
    "batch_norm_mean_sums": _mean_sums,
    "batch_norm_deviation_sums": _deviation_sums,
    "batch_norm_reduced_stats": _reduced_stats,
    "batch_norm_elemt": _elemt,
    "batch_norm_backward_reduce": _backward_reduce,
    "batch_norm_backward_elemt": _backward_elemt,
}


def register_fakes(namespace: str) -> None:
    """Register the fake implementations for the ops of `namespace` (once per process and namespace)."""
    if namespace in _REGISTERED:
        return
    for name in OP_NAMES:
        torch.library.register_fake(f"{namespace}::{name}", _FAKES[name])
    _REGISTERED.add(namespace)
