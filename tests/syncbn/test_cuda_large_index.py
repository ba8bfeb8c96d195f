"""GPU only (marked `cuda`): more than 2^31 elements through the backward ops and the vectorised channels-last
path, so every offset must be 64-bit (test_cuda_kernels.py covers stats and elemt on scalar layouts).

Not run on a GPU yet (none has been available to this project); `pytest -m cuda` on a GPU machine runs it.
Memory: ~4.3 GB per bf16 tensor, 4-5 tensors at a time; skipped below 40 GB of GPU memory.
"""
from __future__ import annotations

import pytest
import torch

from src.syncbn.extension import load_extension

pytestmark = pytest.mark.cuda
EPS = 1e-5
CHUNK = 2**26


def _needs_memory(gb: float) -> None:
    if torch.cuda.get_device_properties(0).total_memory < gb * 2**30:
        pytest.skip(f"needs ~{gb:.0f} GB of GPU memory")


def _channel_sums(cols: list[torch.Tensor], fn) -> torch.Tensor:
    """float64 sums of fn(chunk) over each 1-D column, chunk by chunk (no float64 copy of a whole column)."""
    out = []
    for col in cols:
        total = torch.zeros((), dtype=torch.float64, device=col.device)
        for i in range(0, col.numel(), CHUNK):
            total += fn(col[i:i + CHUNK], i).double().sum()
        out.append(total)
    return torch.stack(out)


def _check_backward(ops, x: torch.Tensor, dy: torch.Tensor, cols_x, cols_dy) -> None:
    """backward_reduce sums against float64 on the same values; backward_elemt on the last rows."""
    c = len(cols_x)
    n = cols_x[0].numel()
    st = ops.batch_norm_stats(x)
    mean = st[1:1 + c].float()
    invstd = (st[1 + c:] / n + EPS).rsqrt().float()
    red = ops.batch_norm_backward_reduce(dy, x, mean, invstd)
    sum_dy = _channel_sums(cols_dy, lambda d, i: d.float())
    abs_dy = _channel_sums(cols_dy, lambda d, i: d.float().abs())
    sum_dy_xhat, abs_dy_xhat = [], []
    for k in range(c):
        f = lambda d, i, k=k: d.float() * (cols_x[k][i:i + CHUNK].float() - mean[k]) * invstd[k]  # noqa: E731
        sum_dy_xhat.append(_channel_sums([cols_dy[k]], f)[0])
        abs_dy_xhat.append(_channel_sums([cols_dy[k]], lambda d, i, f=f: f(d, i).abs())[0])
    # fp32 partial sums merged in float64: far below 1e-4 of sum|.|; a wrapped or dropped range of 2^31
    # offsets would be off by a large fraction of it.
    torch.testing.assert_close(red[:c].double(), sum_dy, rtol=0, atol=float(1e-4 * abs_dy.max()))
    torch.testing.assert_close(red[c:].double(), torch.stack(sum_dy_xhat), rtol=0,
                               atol=float(1e-4 * torch.stack(abs_dy_xhat).max()))
    count = torch.tensor(float(n), dtype=torch.float64, device=x.device)
    dx = ops.batch_norm_backward_elemt(dy, x, mean, invstd, None, red, count)
    for k in range(c):  # the last 1000 values of each channel: the highest offsets
        xk, dyk = cols_x[k][-1000:].float(), cols_dy[k][-1000:].float()
        exp = invstd[k] * (dyk - red[k] / n - (xk - mean[k]) * invstd[k] * red[c + k] / n)
        got = _column(dx, k, x.dim())[-1000:].float()
        torch.testing.assert_close(got, exp, rtol=2.0**-7, atol=2.0**-7 * float(exp.abs().max()))
    del dx, st, red


def _column(t: torch.Tensor, k: int, dim: int) -> torch.Tensor:
    """Channel k of a (1, C, L) channels-first or an (M, C) channels-last tensor, as a 1-D view."""
    return t[0, k] if dim == 3 else t[:, k]


def _randn_bf16(shape, seed: int, loc: float) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16) + loc).to(torch.bfloat16)


def test_backward_beyond_2_pow_31_both_layouts():
    """backward_reduce and backward_elemt on 2^31 + 512 elements, channels-first (1, 2, L) and channels-last (L, 2)."""
    _needs_memory(40)
    ops = load_extension()
    length = 2**30 + 256
    x = _randn_bf16((1, 2, length), 0, 3.0)
    dy = _randn_bf16((1, 2, length), 1, 0.5)
    _check_backward(ops, x, dy, [x[0, 0], x[0, 1]], [dy[0, 0], dy[0, 1]])
    xl, dyl = x[0].t().contiguous(), dy[0].t().contiguous()  # (L, 2): channels-last walk, C = 2 (scalar)
    del x, dy
    _check_backward(ops, xl, dyl, [xl[:, 0], xl[:, 1]], [dyl[:, 0], dyl[:, 1]])


def test_vectorised_channels_last_bf16_c8_beyond_2_pow_31():
    """(M, 8) bf16: one thread loads all 8 channels as one 16-byte vector; 2^31 + 512 elements, every op."""
    _needs_memory(40)
    ops = load_extension()
    rows = 2**28 + 64
    x = _randn_bf16((rows, 8), 2, 2.0)
    dy = _randn_bf16((rows, 8), 3, -0.5)
    assert x.data_ptr() % 16 == 0 and x.numel() > 2**31
    st = ops.batch_norm_stats(x)
    for k in (0, 7):
        col = x[:, k]
        mean = _channel_sums([col], lambda d, i: d.float())[0] / rows
        m2 = _channel_sums([col], lambda d, i: (d.double() - mean) ** 2)[0]
        assert abs(float(st[1 + k]) - float(mean)) < 1e-4
        assert abs(float(st[9 + k]) / float(m2) - 1) < 1e-3
    mean = st[1:9].float()
    invstd = (st[9:] / rows + EPS).rsqrt().float()
    y = ops.batch_norm_elemt(x, None, None, mean, invstd)
    exp = (x[-1000:].float() - mean) * invstd
    torch.testing.assert_close(y[-1000:].float(), exp, rtol=2.0**-7, atol=2.0**-7 * float(exp.abs().max()))
    del y
    _check_backward(ops, x, dy, [x[:, k] for k in range(8)], [dy[:, k] for k in range(8)])
