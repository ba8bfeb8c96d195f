"""The SyncBN autograd Function: the maths order of DESIGN.md section 3 and its two collectives.

Forward (training): local Welford stats -> one all_gather of packed [n, mean, M2] -> Chan merge on the
device (running stats updated there) -> normalise. Backward: local [sum dy, sum dy*xhat] -> one
all_reduce -> dx. The kernels (csrc/syncbn.h) never branch on the device; neither does this file.
Nothing here reads a device value on the host except when this rank holds at most one value per
channel (then the global count decides whether F.batch_norm's "more than 1 value" error applies).
"""
from __future__ import annotations

import os
from typing import Any, Optional

import torch
from torch.autograd.function import FunctionCtx, once_differentiable

from . import collectives

_OPS: Any = None


def kernel_ops() -> Any:
    """The compiled kernel module (built or loaded once per process, on first use).

    SYNCTRAIN_SYNCBN_KERNELS=cuda-emulated selects the CUDA kernels run on the CPU by the SIMT emulation
    (tests: CPU tensors through the CUDA code; see extension.load_emulated_cuda_extension).
    """
    global _OPS
    choice = os.environ.get("SYNCTRAIN_SYNCBN_KERNELS", "")
    if choice == "cuda-emulated":
        from .extension import emulated_cuda_ops

        return emulated_cuda_ops()
    if choice:
        raise ValueError(f"SYNCTRAIN_SYNCBN_KERNELS={choice!r}: expected 'cuda-emulated' or unset")
    if _OPS is None:
        from .extension import load_extension  # deferred: importing src.syncbn never compiles

        _OPS = load_extension()
    return _OPS


def kernel_memory_format(x: torch.Tensor) -> torch.memory_format:
    """The layout the kernels get x in: its own if they take it (no copy), else the one PyTorch suggests."""
    if x.is_contiguous():
        return torch.contiguous_format
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    if x.dim() == 5 and x.is_contiguous(memory_format=torch.channels_last_3d):
        return torch.channels_last_3d
    # Sliced / permuted input: densify in the layout its strides resemble, so a channels_last
    # slice stays channels_last (what nn.BatchNorm's own kernels do via suggest_memory_format).
    try:
        from torch._prims_common import suggest_memory_format  # PyTorch's own rule, private module
    except ImportError:  # pragma: no cover - a future PyTorch moved it: standard layout is always valid
        return torch.contiguous_format
    return suggest_memory_format(x)


def _acc_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _check_more_than_one_value(
    x: torch.Tensor, local_count: int, gathered: torch.Tensor, world_size: int
) -> None:
    """Raise F.batch_norm's ValueError when the whole group holds exactly one value per channel.

    Only ranks with local_count <= 1 look at the global count (one host read). If the global count is 1,
    every rank has local_count <= 1, so every rank looks and raises: the group stays consistent.
    """
    if local_count > 1:
        return
    total = local_count if world_size == 1 else int(gathered[:, 0].sum().item())
    if total == 1:
        where = "" if world_size == 1 else f" on this rank, 1 value per channel in the whole group of {world_size}"
        raise ValueError(
            f"Expected more than 1 value per channel when training, got input size {x.size()}{where}; "
            "use a larger batch, or eval mode"
        )


class SyncBatchNormFunction(torch.autograd.Function):
    """Batch norm over the concatenated batches of a process group (exact for any split)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: FunctionCtx,
        input: torch.Tensor,
        weight: Optional[torch.Tensor],
        bias: Optional[torch.Tensor],
        running_mean: Optional[torch.Tensor],
        running_var: Optional[torch.Tensor],
        num_batches_tracked: Optional[torch.Tensor],
        momentum: float,
        eps: float,
        group: Any,
        world_size: int,
    ) -> torch.Tensor:
        ops = kernel_ops()
        fmt = kernel_memory_format(input)
        x = input.contiguous(memory_format=fmt)  # returns x itself when already in that layout
        channels = x.shape[1]
        local_count = x.numel() // channels

        local = ops.batch_norm_stats(x)  # float64 [2C+1] = [n, mean, M2]
        if world_size > 1:
            gathered = collectives.all_gather_stats(local, group, world_size)
        else:
            gathered = local.view(1, -1)
        _check_more_than_one_value(x, local_count, gathered, world_size)

        mean, invstd, count = ops.batch_norm_gather_stats(
            gathered, running_mean, running_var, num_batches_tracked, momentum, eps,
            x.dtype == torch.float64,
        )
        if local_count > 0:
            y = ops.batch_norm_elemt(x, weight, bias, mean, invstd)
        else:  # this rank only joined the collective; nothing to normalise
            y = torch.empty_like(x)

        ctx.save_for_backward(x, weight, mean, invstd, count)
        ctx.group, ctx.world_size, ctx.fmt = group, world_size, fmt
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Optional[torch.Tensor], ...]:
        x, weight, mean, invstd, count = ctx.saved_tensors
        need_input, need_weight, need_bias = ctx.needs_input_grad[:3]
        ops = kernel_ops()
        channels = x.shape[1]
        dy = grad_out.contiguous(memory_format=ctx.fmt)  # the kernels take dy in x's layout

        if x.numel() > 0:
            reduced = ops.batch_norm_backward_reduce(dy, x, mean, invstd)  # [sum dy, sum dy*xhat]
        else:
            reduced = torch.zeros(2 * channels, dtype=_acc_dtype(x), device=x.device)

        # Local parameter grads (PyTorch's convention: DDP averages them), taken before the
        # in-place all_reduce turns `reduced` into the group sums.
        grad_weight = reduced[channels:].to(weight.dtype, copy=True) if need_weight and weight is not None else None
        grad_bias = reduced[:channels].to(ctx.bias_dtype, copy=True) if need_bias else None

        grad_input = None
        if need_input:
            # Every rank joins the all_reduce, empty or not, so peers never wait on it.
            if ctx.world_size > 1:
                collectives.all_reduce_grads(reduced, ctx.group)
            if x.numel() > 0:
                grad_input = ops.batch_norm_backward_elemt(dy, x, mean, invstd, weight, reduced, count)
            else:
                grad_input = torch.zeros_like(x)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None, None, None


def sync_batch_norm(
    input: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    running_mean: Optional[torch.Tensor],
    running_var: Optional[torch.Tensor],
    num_batches_tracked: Optional[torch.Tensor],
    momentum: float,
    eps: float,
    group: Any,
    world_size: int,
) -> torch.Tensor:
    """Training-mode batch norm over the group; momentum < 0 means cumulative average (1/num_batches_tracked)."""
    return SyncBatchNormFunction.apply(
        input, weight, bias, running_mean, running_var, num_batches_tracked, momentum, eps, group, world_size
    )
