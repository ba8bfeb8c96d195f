"""Per-rank statistics at large |mean| / std, in every layout: the cases and the yardstick, shared by the CPU kernel
tests (test_kernels.py, test_kernels_float64.py), the CUDA kernel tests and the precision benchmark script.

The yardstick is PyTorch's own float32 `torch.var_mean` on the very same values (on the CPU it accumulates in
float64 and rounds once to float32): our variance's relative error against float64 must stay within 10x of
its error, taking for the latter at least float32's half unit in the last place, 2^-24 (its result is a float32:
a channel where it happens to land closer says nothing about the arithmetic).

float32 data go up to |mean| / std = 1e6, where the values' own float32 spacing is ~0.1 std. A 16-bit type holds
a spread only up to |mean| / std of about 2^8 (bfloat16) or 2^11 (float16): beyond that every value rounds to
the mean. So they go to 1e2 and 1e3.
"""
from __future__ import annotations

import torch
from torch import nn

from tests.syncbn.exact_moments import Ratio, exact_moments

# name -> (shape, memory format): every layout the kernels walk.
LAYOUTS = {
    "nc": ((4096, 6), torch.contiguous_format),
    "ncl": ((40, 6, 50), torch.contiguous_format),
    "nchw": ((2, 4, 96, 96), torch.contiguous_format),
    "channels_last": ((12, 16, 14, 14), torch.channels_last),
    "channels_last_3d": ((4, 8, 6, 8, 8), torch.channels_last_3d),
}
RATIOS = {torch.float32: (1.0, 1e2, 1e4, 3e4, 1e6), torch.bfloat16: (1.0, 1e2), torch.float16: (1.0, 1e3)}
CASES = [(layout, dtype, ratio) for layout in LAYOUTS for dtype, ratios in RATIOS.items() for ratio in ratios]
CASE_IDS = [f"{layout}-{str(dtype)[6:]}-{ratio:g}" for layout, dtype, ratio in CASES]


def make(layout: str, dtype: torch.dtype, ratio: float, scale: float = 1.0) -> torch.Tensor:
    """ratio + N(0, 1) (every channel shifted by its index, alternate channels negative), times `scale`."""
    shape, fmt = LAYOUTS[layout]
    gen = torch.Generator().manual_seed(int(ratio) % 1000 + len(shape))
    sign = torch.tensor([(-1.0) ** c for c in range(shape[1])], dtype=torch.float64).view([1, -1] + [1] * (len(shape) - 2))
    chan = torch.arange(shape[1], dtype=torch.float64).view(sign.shape)
    x = sign * (ratio + chan + torch.randn(shape, generator=gen, dtype=torch.float64)) * scale
    return x.to(dtype).contiguous(memory_format=fmt)


def variance_errors(stats: torch.Tensor, x: torch.Tensor) -> tuple[float, float]:
    """(max relative error over the channels of batch_norm_stats' biased variance, the same of torch.var_mean in
    float32 floored at 2^-24), both against float64 on the same values."""
    c = x.shape[1]
    dims = [0, *range(2, x.dim())]
    x64 = x.double().cpu()
    truth = x64.var(dim=dims, unbiased=False)
    assert (truth > 0).all(), "a case must keep a spread in its dtype"
    stats = stats.double().cpu()
    ours = stats[1 + c:] / stats[0]
    theirs, _ = torch.var_mean(x.float().cpu(), dim=dims, unbiased=False)
    rel = lambda v: float(((v.double() - truth).abs() / truth).max())  # noqa: E731
    return rel(ours), max(rel(theirs), 2.0**-24)


# float64 input goes to |mean| / std = 1e8, against exact values (exact_moments.py), with nn.BatchNorm's float64 CPU
# error as the yardstick (each error taken as at least float64's half unit in the last place, 2^-53): the layouts
# above, plus many channels in (N, C) and small planes.
FLOAT64_LAYOUTS = {**LAYOUTS, "nc_2048": ((64, 2048), torch.contiguous_format),
                   "nchw_3x3": ((64, 16, 3, 3), torch.contiguous_format)}
FLOAT64_RATIOS = (1e4, 1e8)
BATCHNORMS = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d, 5: nn.BatchNorm3d}


def make_float64(layout: str, ratio: float) -> torch.Tensor:
    """ratio + N(0, 1) + the channel's index, alternate channels negative, float64 in the layout's memory format."""
    shape, fmt = FLOAT64_LAYOUTS[layout]
    gen = torch.Generator().manual_seed(len(shape))
    view = [1, -1] + [1] * (len(shape) - 2)
    sign = torch.tensor([(-1.0) ** c for c in range(shape[1])], dtype=torch.float64).view(view)
    chan = torch.arange(shape[1], dtype=torch.float64).view(view)
    return (sign * (ratio + chan + torch.randn(shape, generator=gen, dtype=torch.float64))).contiguous(memory_format=fmt)


def _relative_error(values: torch.Tensor, exact: list[Ratio]) -> float:
    """Largest |value - exact| / |exact| over the channels, at least 2^-53."""
    return max(max(e.relative_error(v) for v, e in zip(values.double().cpu().tolist(), exact)), 2.0**-53)


def float64_errors(x: torch.Tensor, mean: torch.Tensor, unbiased_var: torch.Tensor) -> dict[str, tuple[float, float]]:
    """{"mean": (ours, nn.BatchNorm's), "variance": (ours, nn.BatchNorm's)}: the largest relative error over the channels
    of `mean` and `unbiased_var` (ours, for the batch x) and of nn.BatchNorm's training forward with momentum=1 (its
    running buffers then hold the batch's mean and unbiased variance), against the exact values."""
    c = x.shape[1]
    n = x.numel() // c
    theirs = BATCHNORMS[x.dim()](c, momentum=1.0, dtype=torch.float64).train()
    with torch.no_grad():
        theirs(x.cpu())
    exact = exact_moments(x)
    means = [m for m, _ in exact]
    unbiased = [v.scaled(n, n - 1) for _, v in exact]
    return {"mean": (_relative_error(mean, means), _relative_error(theirs.running_mean, means)),
            "variance": (_relative_error(unbiased_var, unbiased), _relative_error(theirs.running_var, unbiased))}
