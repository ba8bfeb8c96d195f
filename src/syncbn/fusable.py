"""The two elementwise SyncBN kernels as plain aten ops, for torch.compile to fuse with their neighbours.

Our elementwise kernels are opaque custom ops: under torch.compile, Inductor cannot fuse the
normalisation with the ReLU or residual add around it, and every boundary costs a read and a write of
the activation. While tracing, SyncBatchNormFunction uses these instead (the statistics kernels and the
collectives stay custom ops, so there is still one collective each way). They follow the kernels'
arithmetic (csrc/cpu/elemt.cpp, backward_elemt.cpp): per-channel coefficients formed in float64 and
rounded once to the accumulation type (float32, float64 for float64 input), then one pointwise
expression in that type; for float64 the results agree with the kernels to rounding (~1e-16).
"""
from __future__ import annotations

import os
from typing import Optional

import torch

# Which passes use the aten form under torch.compile: "forward", "backward", both (default) or "none".
# Read once at import; for measuring what each one gains (scripts/bench_compile.py --paired --fuse).
FUSE_ENV = "SYNCTRAIN_SYNCBN_FUSE"
_CHOICE = os.environ.get(FUSE_ENV, "forward,backward")
# PyTorch 2.11's Dynamo drops the backward of SyncBatchNormFunction when its forward returns these aten ops'
# output: the compiled pass then gives zero gradients everywhere upstream (tests/syncbn/test_compile.py run
# with torch 2.11). The forward is fused from 2.13 on (2.13 and 2.14 checked; 2.12 not), the backward on all.
_TORCH = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
FUSE_FORWARD = "forward" in _CHOICE and _TORCH >= (2, 13)
FUSE_BACKWARD = "backward" in _CHOICE


def _per_channel(v: torch.Tensor, x: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """[C] vector shaped to broadcast along dim 1 of x, in the accumulation dtype."""
    return v.to(acc).view((1, -1) + (1,) * (x.dim() - 2))


def _acc(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def batch_norm_elemt(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                     mean: torch.Tensor, invstd: torch.Tensor) -> torch.Tensor:
    """y = (x - mean) * (invstd * weight) + bias in x's dtype, computed in the kernels' accumulation type."""
    acc = _acc(x)
    scale = invstd.double() * weight.double() if weight is not None else invstd.double()
    y = (x.to(acc) - _per_channel(mean, x, acc)) * _per_channel(scale, x, acc)
    if bias is not None:
        y = y + _per_channel(bias, x, acc)
    return y.to(x.dtype)


def batch_norm_backward_elemt(dy: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, invstd: torch.Tensor,
                              weight: Optional[torch.Tensor], reduced: torch.Tensor,
                              count: torch.Tensor) -> torch.Tensor:
    """dx = dy*g + (x - mean)*q + p with g = weight*invstd, q = -g*invstd*sum_dy_xhat/n, p = -g*sum_dy/n.

    `reduced` is the group's [sum_dy, sum_dy_xhat] and `count` the group's element count n (> 0 here: the
    caller uses the kernel for an empty group).
    """
    acc = _acc(x)
    channels = x.shape[1]
    inv = invstd.double()
    gain = inv * weight.double() if weight is not None else inv
    n = count.double()
    sum_dy, sum_dy_xhat = reduced[:channels].double(), reduced[channels:].double()
    slope = -gain * inv * sum_dy_xhat / n
    offset = -gain * sum_dy / n
    dx = (dy.to(acc) * _per_channel(gain, x, acc)
          + (x.to(acc) - _per_channel(mean, x, acc)) * _per_channel(slope, x, acc)
          + _per_channel(offset, x, acc))
    return dx.to(x.dtype)
