"""The aten form of the elementwise kernels (used while torch.compile traces) computes what the kernels compute.

float64 agrees to rounding (1e-12 relative leaves room for a fused multiply-add on one side only);
float32 to a few ulp (1e-6); bfloat16 to one bf16 ulp (rounding of the same float32 value may differ
when the two sides' float32 results straddle a bf16 rounding boundary). Layout is preserved.
"""
from __future__ import annotations

from typing import Optional

import pytest
import torch

from src.syncbn import fusable
from src.syncbn.functions import kernel_ops

TOL = {torch.float64: dict(rtol=1e-12, atol=1e-12), torch.float32: dict(rtol=1e-6, atol=1e-6),
       torch.bfloat16: dict(rtol=1e-2, atol=1e-2)}
SHAPES = [(6, 5), (4, 5, 7), (3, 5, 4, 6), (2, 5, 3, 4, 2)]


def _inputs(shape: tuple[int, ...], dtype: torch.dtype, channels_last: bool, affine: bool
            ) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    gen = torch.Generator().manual_seed(len(shape))
    x = (torch.randn(shape, generator=gen, dtype=torch.float64) * 3 + 2).to(dtype)
    dy = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    if channels_last and x.dim() == 4:
        x, dy = x.contiguous(memory_format=torch.channels_last), dy.contiguous(memory_format=torch.channels_last)
    c = shape[1]
    w = torch.rand(c, generator=gen, dtype=torch.float64).float() + 0.5 if affine else None
    b = torch.randn(c, generator=gen, dtype=torch.float64).float() if affine else None
    return x, dy, w, b


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("affine", [True, False])
def test_aten_form_equals_kernels(dtype: torch.dtype, shape: tuple[int, ...], channels_last: bool,
                                  affine: bool) -> None:
    ops = kernel_ops()
    x, dy, w, b = _inputs(shape, dtype, channels_last, affine)
    if dtype == torch.float64:
        w, b = (w.double(), b.double()) if affine else (w, b)
    stats = ops.batch_norm_stats(x).view(1, -1)
    mean, invstd, count = ops.batch_norm_gather_stats(stats, None, None, None, 0.1, 1e-5, dtype == torch.float64)
    y = fusable.batch_norm_elemt(x, w, b, mean, invstd)
    expected = ops.batch_norm_elemt(x, w, b, mean, invstd)
    assert y.dtype == expected.dtype and y.stride() == expected.stride()
    torch.testing.assert_close(y, expected, **TOL[dtype])

    reduced = ops.batch_norm_backward_reduce(dy, x, mean, invstd) * 1.5  # as if summed over a group
    dx = fusable.batch_norm_backward_elemt(dy, x, mean, invstd, w, reduced, count)
    expected = ops.batch_norm_backward_elemt(dy, x, mean, invstd, w, reduced, count)
    assert dx.dtype == expected.dtype and dx.stride() == expected.stride()
    torch.testing.assert_close(dx, expected, **TOL[dtype])


def test_compiled_graphs_use_the_aten_form_and_keep_the_statistics_kernels() -> None:
    """Under torch.compile the elementwise kernels are gone from the graphs; the statistics kernels stay."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    from src.syncbn import SyncBatchNorm2d

    graphs: list[str] = []

    def capture(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(str(gm.graph))
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    layer = torch.nn.Sequential(SyncBatchNorm2d(4), torch.nn.ReLU()).double()
    compiled = torch.compile(layer, fullgraph=True, backend=aot_autograd(fw_compiler=capture, bw_compiler=capture))
    x = torch.randn(3, 4, 5, 5, dtype=torch.float64, requires_grad=True)
    compiled(x).sum().backward()
    forward, backward = graphs
    assert "batch_norm_stats" in forward and "batch_norm_gather_stats" in forward
    assert ("batch_norm_elemt" not in forward) == fusable.FUSE_FORWARD  # not fused on PyTorch 2.11 (fusable.py)
    assert "batch_norm_backward_reduce" in backward and "batch_norm_backward_elemt" not in backward
