"""The SyncBN autograd Function: the maths of docs/syncbn.md and its collectives (two forward, one backward).

Forward (training): local Welford stats [n, mean, M2] (batch_norm_stats) -> all_reduce of [n, n*mean] (C+1 values)
and the call's identity (4 values, exchange_tag.py) -> every rank holds the global count N and mean S/N, and NaN in
S when the ranks were not all at the same call of the same layer -> all_reduce of M2 + n (mean_r - S/N)^2 (C
values, every term non-negative: this sum cannot cancel; S can, when rank means differ in sign, and its error is
then relative to the spread, docs/syncbn.md) -> the merged statistics and the running-statistics update, on the
device -> normalise. That is Chan's merge of the ranks' [n, mean, M2] rows term for term, as an all_gather of the
rows computes it, only summed by the collectives: as exact as the gather for every input, with no state kept
between steps but the layer's call count, 2C+5 values per rank and layer whatever the world size. Backward: local
[sum dy, sum dy*xhat] -> one all_reduce -> dx. The kernels (csrc/ops.h) never branch on the device; neither does
this file. A layer may ask for the gather instead (`exchange="all_gather"`: one collective of W(2C+3) values), for
comparisons.

torch.compile traces all of it (fullgraph): the kernels are dispatcher operators with fake implementations
(fake_kernels.py), the two elementwise ones replaced while tracing by their aten form (fusable.py) so Inductor
fuses them with the ReLU / residual add around them; the collectives are functional collectives on a group name.
Host reads in a training step: none, except on a rank whose input holds at most one value per channel (decided by
the input's shape): that rank reads the global count, to raise F.batch_norm's "more than 1 value" error.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Optional, Sequence

import torch
from torch.autograd.function import FunctionCtx, once_differentiable

from . import collectives, exchange_tag, fusable
from .fake_kernels import OP_NAMES, register_fakes
from .recompute import ForwardStatistics


@dataclass(frozen=True)
class KernelOps:
    """The eight kernel ops as callables, and where they come from.

    `traceable`: they are dispatcher operators (torch.ops.<namespace>) with fake implementations, so
    torch.compile can trace them; otherwise they are plain Python-bound functions (eager only).
    """

    batch_norm_stats: Callable[..., Any]
    batch_norm_gather_stats: Callable[..., Any]
    batch_norm_mean_sums: Callable[..., Any]
    batch_norm_deviation_sums: Callable[..., Any]
    batch_norm_reduced_stats: Callable[..., Any]
    batch_norm_elemt: Callable[..., Any]
    batch_norm_backward_reduce: Callable[..., Any]
    batch_norm_backward_elemt: Callable[..., Any]
    traceable: bool
    library: Optional[str]  # file of the loaded extension, if it is one
    module: Any = None  # the extension itself (e.g. the emulation's schedule and counters)

    @classmethod
    def from_module(cls, module: ModuleType) -> "KernelOps":
        """The ops of a loaded kernel extension: its operators when it registered them, else its functions."""
        namespace = getattr(module, "ops_namespace", None)
        if namespace is not None:
            register_fakes(namespace)
            packet = getattr(torch.ops, namespace)
            # The overloads themselves, not the packets: one lookup less per call in eager mode.
            fns = {name: getattr(packet, name).default for name in OP_NAMES}
        else:
            fns = {name: getattr(module, name) for name in OP_NAMES}
        return cls(**fns, traceable=namespace is not None, library=getattr(module, "__file__", None), module=module)


_OPS: Optional[KernelOps] = None


def use_kernel_module(module: ModuleType) -> KernelOps:
    """Make `module` (a loaded kernel extension) the kernels of this process; returns its ops."""
    global _OPS
    _OPS = KernelOps.from_module(module)
    return _OPS


KERNELS_ENV = "SYNCTRAIN_SYNCBN_KERNELS"


def _load_kernel_module() -> ModuleType:
    """The extension for this machine; or, with SYNCTRAIN_SYNCBN_KERNELS=cuda-emulated, the CUDA kernels run on
    the CPU by the SIMT emulation (CPU tensors through the CUDA code; eager only). Read once, at first use."""
    from . import extension  # deferred: importing src.syncbn never compiles

    choice = os.environ.get(KERNELS_ENV, "")
    if choice == "cuda-emulated":
        return extension.emulated_cuda_ops()
    if choice:
        raise ValueError(f"{KERNELS_ENV}={choice!r}: expected 'cuda-emulated' or unset")
    return extension.load_extension()


@torch.compiler.assume_constant_result
def _kernels_loaded() -> bool:
    # torch.compile runs this for real while tracing (its result is a constant of the graph), so
    # the first call of a compiled model may also be the process's first use of the kernels: they
    # are loaded then, instead of Dynamo trying to trace the loader (a graph break).
    if _OPS is None:
        use_kernel_module(_load_kernel_module())
    return True


def kernel_ops() -> KernelOps:
    """The kernel ops (the extension is built or loaded once per process, on first use; see _load_kernel_module)."""
    _kernels_loaded()
    ops = _OPS
    assert ops is not None
    if not ops.traceable and torch.compiler.is_compiling():
        raise RuntimeError(
            f"the SyncBN kernels in use ({ops.library}) are plain Python functions, which "
            f"torch.compile cannot trace; run this model eagerly, or unset {KERNELS_ENV} for the default kernels"
        )
    return ops


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


def _one_value_error(shape: Sequence[int], world_size: int) -> ValueError:
    where = "" if world_size == 1 else f" on this rank, 1 value per channel in the whole group of {world_size}"
    return ValueError(
        f"Expected more than 1 value per channel when training, got input size {torch.Size(shape)}{where}; "
        "use a larger batch, or eval mode"
    )


# cudagraph_unsafe: it reads a device value on the host, which a CUDA graph cannot capture; Inductor
# (mode="reduce-overhead") then partitions its CUDA graphs around it. Only graphs traced for a
# rank holding at most one value per channel contain it.
@torch.library.custom_op(
    "synctrain::require_more_than_one_value", mutates_args=(), tags=(torch.Tag.cudagraph_unsafe,)
)
def _require_more_than_one_value(counted: torch.Tensor, input_shape: Sequence[int], world_size: int) -> torch.Tensor:
    """Raise F.batch_norm's ValueError if `counted`'s counts (element 0 of each row) add up to 1; else pass it on."""
    total = counted.reshape(-1, counted.shape[-1])[:, 0].sum()
    if int(total.item()) == 1:  # one host read: only ranks holding <= 1 value get here
        raise _one_value_error(input_shape, world_size)
    return counted.clone()  # an operator's output may not alias its input


@_require_more_than_one_value.register_fake
def _(counted: torch.Tensor, input_shape: Sequence[int], world_size: int) -> torch.Tensor:
    return torch.empty_like(counted)


def _check_more_than_one_value(input_shape: Sequence[int], counted: torch.Tensor, world_size: int) -> torch.Tensor:
    """`counted` (gathered rows, or the all-reduced [N, ...]), after raising F.batch_norm's ValueError when the whole
    group holds one value per channel.

    Only ranks holding <= 1 value per channel (local_count, from the input's shape) look at the global
    count (one host read, inside an operator, so a compiled graph keeps it without a break). If the global count is
    1, every rank has local_count <= 1, so every rank looks and raises: the group stays consistent. local_count
    comes from the shape, so under torch.compile this branch is decided while tracing, and a rank holding more
    than one value per channel never reads the host. The check cannot move to the device: F.batch_norm's
    contract is a Python ValueError, which only the host can raise.
    """
    local_count = input_shape[0] * math.prod(input_shape[2:])
    if local_count > 1:
        return counted
    return _require_more_than_one_value(counted, list(input_shape), world_size)


EXCHANGES = ("all_reduce", "all_gather")


def _global_statistics(
    ops: KernelOps,
    x: torch.Tensor,
    running_mean: Optional[torch.Tensor],
    running_var: Optional[torch.Tensor],
    num_batches_tracked: Optional[torch.Tensor],
    momentum: float,
    eps: float,
    group_name: str,
    world_size: int,
    exchange: str = "all_reduce",
    identity: Optional[torch.Tensor] = None,
    first_out_of_step: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mean, invstd, count) over the group, running stats updated; no host read (see the module docstring).

    exchange="all_reduce": two all_reduces of C+1 and C values; "all_gather": one all_gather of W rows of 2C+1.
    With `identity` (the layer's [calls, index], exchange_tag.py) the first collective also carries it: ranks that
    disagree get NaN statistics, and `first_out_of_step` keeps the identity of the call at which that first happened.
    """
    local = ops.batch_norm_stats(x)  # float64 [2C+1] = [n, mean, M2]
    acc_double = x.dtype == torch.float64
    checked = world_size > 1 and identity is not None and first_out_of_step is not None
    if world_size > 1 and exchange == "all_reduce":
        if checked:
            payload = exchange_tag.reduce_payload(identity, world_size, ops.batch_norm_mean_sums(local))
            reduced = collectives.all_reduce_stats(payload, group_name)
            sums = exchange_tag.checked_mean_sums(reduced, payload, world_size, identity, first_out_of_step)
        else:
            sums = collectives.all_reduce_stats(ops.batch_norm_mean_sums(local), group_name)  # [N, sum n*mean]
        sums = _check_more_than_one_value(x.shape, sums, world_size)
        m2 = collectives.all_reduce_stats(ops.batch_norm_deviation_sums(local, sums), group_name)
        return ops.batch_norm_reduced_stats(
            sums, m2, running_mean, running_var, num_batches_tracked, momentum, eps, acc_double)
    if exchange not in EXCHANGES:
        raise ValueError(f"SyncBatchNorm exchange={exchange!r}: expected one of {EXCHANGES}")
    if checked:
        gathered = collectives.all_gather_stats(exchange_tag.gather_row(identity, local), group_name, world_size)
        gathered = exchange_tag.checked_rows(gathered, identity, first_out_of_step)
    elif world_size > 1:
        gathered = collectives.all_gather_stats(local, group_name, world_size)
    else:
        gathered = local.view(1, -1)
    gathered = _check_more_than_one_value(x.shape, gathered, world_size)
    return ops.batch_norm_gather_stats(
        gathered, running_mean, running_var, num_batches_tracked, momentum, eps, acc_double,
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
        group_name: str,
        world_size: int,
        record: Optional[ForwardStatistics] = None,
        replay: Optional[ForwardStatistics] = None,
        exchange: str = "all_reduce",
        identity: Optional[torch.Tensor] = None,
        first_out_of_step: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        ops = kernel_ops()
        fmt = kernel_memory_format(input)
        x = input.contiguous(memory_format=fmt)  # returns x itself when already in that layout

        if replay is not None:
            # A checkpoint's recomputation (recompute.py): the first forward's global statistics, so no
            # collective and no second running-statistics update.
            mean, invstd, count = replay.stats()
        else:
            mean, invstd, count = _global_statistics(
                ops, x, running_mean, running_var, num_batches_tracked, momentum, eps, group_name, world_size,
                exchange, identity, first_out_of_step)
            if record is not None:
                record.mean, record.invstd, record.count = mean, invstd, count
                ctx.record = record  # the autograd node owns it: it lives exactly as long as the graph
        # Also on a rank with an empty batch (the kernel then returns an empty y): y must depend on
        # the exchanged statistics, or a compiled graph would drop the collectives as dead code on
        # that rank (functional collectives are pure ops) while its peers wait in it.
        if fusable.FUSE_FORWARD and torch.compiler.is_compiling() and x.numel() > 0:
            y = fusable.batch_norm_elemt(x, weight, bias, mean, invstd)  # aten ops Inductor fuses with neighbours
        else:
            y = ops.batch_norm_elemt(x, weight, bias, mean, invstd)

        ctx.save_for_backward(x, weight, mean, invstd, count)
        ctx.group_name, ctx.world_size, ctx.fmt = group_name, world_size, fmt
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Optional[torch.Tensor], ...]:
        x, weight, mean, invstd, count = ctx.saved_tensors
        record = getattr(ctx, "record", None)
        if record is not None:
            record.consumed = True  # no later recomputation can belong to this forward
        need_input, need_weight, need_bias = ctx.needs_input_grad[:3]
        ops = kernel_ops()
        channels = x.shape[1]
        dy = grad_out.contiguous(memory_format=ctx.fmt)  # the kernels take dy in x's layout

        reduced = ops.batch_norm_backward_reduce(dy, x, mean, invstd)  # [sum dy, sum dy*xhat]; 0 if empty

        # Local parameter grads (PyTorch's convention: DDP averages them), each in its own memory
        # rather than views of one buffer; the all_reduce below returns the group sums as a new
        # tensor and leaves `reduced` as it is.
        grad_weight = reduced[channels:].to(weight.dtype, copy=True) if need_weight and weight is not None else None
        grad_bias = reduced[:channels].to(ctx.bias_dtype, copy=True) if need_bias else None

        grad_input = None
        if need_input:
            # Every rank joins the all_reduce, empty or not, so peers never wait on it; and, as in
            # the forward, dx depends on its result even when empty, so no graph drops it.
            if ctx.world_size > 1:
                reduced = collectives.all_reduce_grads(reduced, ctx.group_name)
            if fusable.FUSE_BACKWARD and torch.compiler.is_compiling() and x.numel() > 0:
                grad_input = fusable.batch_norm_backward_elemt(dy, x, mean, invstd, weight, reduced, count)
            else:
                grad_input = ops.batch_norm_backward_elemt(dy, x, mean, invstd, weight, reduced, count)
        return (grad_input, grad_weight, grad_bias, None, None, None, None, None, None, None, None, None, None, None,
                None)


def sync_batch_norm(
    input: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    running_mean: Optional[torch.Tensor],
    running_var: Optional[torch.Tensor],
    num_batches_tracked: Optional[torch.Tensor],
    momentum: float,
    eps: float,
    group_name: str,
    world_size: int,
    record: Optional[ForwardStatistics] = None,
    replay: Optional[ForwardStatistics] = None,
    exchange: str = "all_reduce",
    identity: Optional[torch.Tensor] = None,
    first_out_of_step: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Training-mode batch norm over the named group; momentum < 0 means cumulative average (1/num_batches_tracked).

    `record` receives this forward's global statistics; `replay` supplies a first forward's instead of
    computing them (an activation-checkpoint recomputation: no collective, no running-statistics update).
    `exchange`: how the forward's statistics travel, "all_reduce" (two collectives, 2C+1 values in all) or
    "all_gather" (one, W(2C+1) values); both give the same merge.
    `identity` ([calls, index], float64) and `first_out_of_step` (the same shape, updated in place): the layer's
    exchange tag (exchange_tag.py); with them the exchange also checks that every rank is at the same call of the
    same layer, and makes the statistics NaN on every rank when not. SyncBatchNorm passes its own.
    """
    return SyncBatchNormFunction.apply(
        input, weight, bias, running_mean, running_var, num_batches_tracked, momentum, eps, group_name,
        world_size, record, replay, exchange, identity, first_out_of_step,
    )
