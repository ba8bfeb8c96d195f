"""float64 SyncBN is as precise as PyTorch's float64 BatchNorm, against exact values (exact_moments.py).

Per layout, at |mean| / std of 1e4 and 1e8: a training forward with momentum=1 leaves the batch's mean and unbiased
variance in the running buffers, computed by SyncBatchNorm (one process: our CPU kernels' statistics and merge) and
by nn.BatchNorm on the same values. Ours must be within 10x of nn.BatchNorm's error, each taken as at least
float64's half unit in the last place (2^-53): a result that lands closer says nothing about the arithmetic.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from src.syncbn import SyncBatchNorm1d, SyncBatchNorm2d, SyncBatchNorm3d
from tests.syncbn import precision_cases as pc
from tests.syncbn.exact_moments import Ratio, exact_moments

# precision_cases' layouts, plus many channels in (N, C) and small planes (the 3x3 planes of the planes layout).
LAYOUTS = {**pc.LAYOUTS, "nc_2048": ((64, 2048), torch.contiguous_format),
           "nchw_3x3": ((64, 16, 3, 3), torch.contiguous_format)}
RATIOS = (1e4, 1e8)
MODULES = {2: (SyncBatchNorm1d, nn.BatchNorm1d), 3: (SyncBatchNorm1d, nn.BatchNorm1d),
           4: (SyncBatchNorm2d, nn.BatchNorm2d), 5: (SyncBatchNorm3d, nn.BatchNorm3d)}


def make(layout: str, ratio: float) -> torch.Tensor:
    """ratio + N(0, 1) + the channel's index, alternate channels negative, in the layout's memory format."""
    shape, fmt = LAYOUTS[layout]
    gen = torch.Generator().manual_seed(len(shape))
    view = [1, -1] + [1] * (len(shape) - 2)
    sign = torch.tensor([(-1.0) ** c for c in range(shape[1])], dtype=torch.float64).view(view)
    chan = torch.arange(shape[1], dtype=torch.float64).view(view)
    return (sign * (ratio + chan + torch.randn(shape, generator=gen, dtype=torch.float64))).contiguous(memory_format=fmt)


def relative_errors(values: torch.Tensor, exact: list[Ratio]) -> float:
    """Largest |value - exact| / |exact| over the channels, at least 2^-53."""
    return max(max(e.relative_error(v) for v, e in zip(values.tolist(), exact)), 2.0**-53)


@pytest.mark.parametrize("ratio", RATIOS, ids=lambda r: f"{r:g}")
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_float64_statistics_as_precise_as_batchnorm(layout, ratio):
    x = make(layout, ratio)
    ours_cls, torch_cls = MODULES[x.dim()]
    ours = ours_cls(x.shape[1], momentum=1.0, dtype=torch.float64).train()
    theirs = torch_cls(x.shape[1], momentum=1.0, dtype=torch.float64).train()
    with torch.no_grad():
        ours(x)
        theirs(x)
    exact = exact_moments(x)
    n = x.numel() // x.shape[1]
    means = [m for m, _ in exact]
    unbiased = [v.scaled(n, n - 1) for _, v in exact]
    for what, ours_t, theirs_t, truth in [("mean", ours.running_mean, theirs.running_mean, means),
                                          ("variance", ours.running_var, theirs.running_var, unbiased)]:
        ours_err, theirs_err = relative_errors(ours_t, truth), relative_errors(theirs_t, truth)
        assert ours_err <= 10 * theirs_err, f"{what}: relative error {ours_err:.3g}, nn.BatchNorm's {theirs_err:.3g}"
