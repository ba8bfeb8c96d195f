"""Per-rank statistics up to float max: the inputs and the contract, shared by the CPU kernel tests (test_kernels.py)
and the CUDA kernel tests (test_cuda_kernel_fixes.py; emulated in every `make test`, on a GPU too).

Each input holds, per magnitude m, four kinds of channel (channel c is kind c % 4): constant m, constant -m,
near-constant (m (1 - 10^-3 |z|), z normal) and spread over [-m, m] (m u, u uniform). The magnitudes go from the
dtype's tiny end (where squares of the spread underflow even float32) through the square root of its max (where
they overflow) to its max.

The contract (docs/syncbn.md, "Per-rank statistics"), against float64 on the very same values:
- batch_norm_stats is finite; each channel's mean is within 1e-6 of max(|mean|, std), its M2 within 1e-6 of M2;
- a constant channel's mean is its value and its M2 exactly 0;
- through the merge, a constant channel's running variance moves to (1 - momentum) times its old value (what
  nn.BatchNorm's float32 arithmetic gives), and y and dx are finite for the constant and near-constant channels
  (a spread channel at float max has |x - mean| beyond float max: its y overflows, as nn.BatchNorm's does).
"""
from __future__ import annotations

import torch

from tests.syncbn import reference_ops as ref

KINDS = 4  # constant m, constant -m, near-constant, spread
TOL = 1e-6
EPS = 1e-5
MOMENTUM = 0.1

# dtype -> magnitudes: tiny, 1, about sqrt(max) (squares overflow the dtype beyond), 1e30, 1e37, max.
MAGNITUDES = {
    torch.float32: (1e-30, 1.0, 2e19, 1e30, 1e37, torch.finfo(torch.float32).max),
    torch.bfloat16: (1e-30, 1.0, 2e19, 1e30, 1e37, torch.finfo(torch.bfloat16).max),
    torch.float16: (1e-6, 1.0, 256.0, 1e4, torch.finfo(torch.float16).max),
}
DTYPES = list(MAGNITUDES)

# Per-rank (count, mean) rows of one channel at float32's max, means of both signs (53 significant bits, so n * mean
# rounds): the gather must add the same terms as the two all_reduces, and give their mean.
FLOAT_MAX_ROWS = {
    "equal_counts": [(3.0, 3.0e38 * 0.7), (3.0, -3.0e38 * 0.7)],
    "uneven_counts": [(5.0, 2.5579676548895632e38), (3.0, -2.5579676548895632e38)],
    "three_ranks": [(6.0, 3.050791051907979e38), (7.0, -3.050791051907979e38), (1.0, 3.050791051907979e38)],
    "four_ranks": [(9.0, 2.261335271616597e38), (2.0, -2.261335271616597e38), (6.0, 2.261335271616597e38),
                   (7.0, -2.261335271616597e38)],
}


def make(shape: tuple[int, ...], fmt: torch.memory_format, dtype: torch.dtype, magnitude: float,
         device: str = "cpu") -> torch.Tensor:
    """One input of the four kinds of channel at `magnitude`, in `fmt` (values from a CPU generator)."""
    gen = torch.Generator().manual_seed(len(shape) + shape[1])
    c = shape[1]
    view = [1, c] + [1] * (len(shape) - 2)
    kind = (torch.arange(c) % KINDS).view(view).expand(shape)
    near = 1.0 - 1e-3 * torch.randn(shape, generator=gen, dtype=torch.float64).abs()
    spread = torch.rand(shape, generator=gen, dtype=torch.float64) * 2.0 - 1.0
    one = torch.ones(shape, dtype=torch.float64)
    unit = torch.where(kind == 0, one, torch.where(kind == 1, -one, torch.where(kind == 2, near, spread)))
    x = (unit * magnitude).to(dtype)
    assert torch.isfinite(x).all()
    return x.contiguous(memory_format=fmt).to(device)


def check_stats(stats: torch.Tensor, x: torch.Tensor, what: str) -> None:
    """batch_norm_stats' output `stats` for x against the contract above."""
    stats = stats.cpu()
    c = x.shape[1]
    exp = ref.batch_norm_stats(x.cpu())  # float64, two passes: exact enough as the yardstick
    assert torch.isfinite(exp).all()
    assert torch.isfinite(stats).all(), f"{what}: non-finite statistics {stats}"
    assert float(stats[0]) == float(exp[0]), what
    mean, m2, emean, em2 = stats[1:1 + c], stats[1 + c:], exp[1:1 + c], exp[1 + c:]
    scale = torch.maximum(emean.abs(), (em2 / exp[0]).sqrt())
    assert ((mean - emean).abs() <= TOL * scale).all(), f"{what}: mean {mean} against {emean}"
    assert ((m2 - em2).abs() <= TOL * em2).all(), f"{what}: M2 {m2} against {em2}"
    constant = torch.arange(c) % KINDS < 2
    first = x.cpu().double().transpose(0, 1).reshape(c, -1)[:, 0]
    assert torch.equal(mean[constant], first[constant]), f"{what}: constant channels' mean {mean[constant]}"
    assert torch.equal(m2[constant], torch.zeros_like(m2[constant])), f"{what}: constant channels' M2 {m2[constant]}"


def check_gather_matches_all_reduces(ops, rows: str, device: str = "cpu") -> None:
    """batch_norm_gather_stats on FLOAT_MAX_ROWS[rows] (plus a channel of ordinary values) against the exchange's three
    ops with the all_reduces' sums taken in rank order, as the gather adds: the same mean bit for bit, exactly 0 for
    equal counts."""
    gathered = torch.tensor([[n, m, 0.5 * (r + 1), 1e70, 2.0] for r, (n, m) in enumerate(FLOAT_MAX_ROWS[rows])],
                            dtype=torch.float64, device=device)
    mean, invstd, count = ops.batch_norm_gather_stats(gathered, None, None, None, MOMENTUM, EPS, True)
    sums = sum(ops.batch_norm_mean_sums(r) for r in gathered)
    m2 = sum(ops.batch_norm_deviation_sums(r, sums) for r in gathered)
    rmean, rinvstd, rcount = ops.batch_norm_reduced_stats(sums, m2, None, None, None, MOMENTUM, EPS, True)
    mean, rmean = mean.cpu(), rmean.cpu()
    assert torch.equal(mean, rmean), (rows, mean, rmean)
    torch.testing.assert_close(invstd.cpu(), rinvstd.cpu(), rtol=1e-15, atol=0)
    assert torch.isfinite(invstd.cpu()).all() and float(count) == float(rcount)
    if rows == "equal_counts":
        assert float(mean[0]) == 0.0, mean


def check_forward_backward(ops, x: torch.Tensor, what: str) -> None:
    """The merge, y and dx of the kernels `ops` for x against the contract above."""
    c = x.shape[1]
    stats = ops.batch_norm_stats(x)
    running_mean = torch.zeros(c, device=x.device)
    running_var = torch.full((c,), 2.0, device=x.device)
    mean, invstd, count = ops.batch_norm_gather_stats(stats.view(1, -1), running_mean, running_var, None, MOMENTUM,
                                                      EPS, False)
    constant = torch.arange(c) % KINDS < 2
    kept = torch.arange(c) % KINDS < 3  # constant and near-constant
    rv = running_var.cpu()
    torch.testing.assert_close(rv[constant], torch.full((int(constant.sum()),), 2.0 * (1 - MOMENTUM)), rtol=1e-7,
                               atol=0, msg=lambda m: f"{what}: constant channels' running variance: {m}")
    assert torch.isfinite(mean.cpu()).all() and torch.isfinite(invstd.cpu()).all(), f"{what}: {mean} {invstd}"
    weight = torch.linspace(0.5, 1.5, c, device=x.device)
    bias = torch.linspace(-1.0, 1.0, c, device=x.device)
    y = ops.batch_norm_elemt(x, weight, bias, mean, invstd)
    dy = torch.ones_like(x)
    reduced = ops.batch_norm_backward_reduce(dy, x, mean, invstd)
    dx = ops.batch_norm_backward_elemt(dy, x, mean, invstd, weight, reduced, count)
    per_channel = lambda t: t.cpu().float().transpose(0, 1).reshape(c, -1)  # noqa: E731
    y_c, dx_c = per_channel(y), per_channel(dx)
    assert torch.isfinite(y_c[kept]).all() and torch.isfinite(dx_c[kept]).all(), f"{what}: y or dx not finite"
    assert torch.equal(y_c[constant], bias.cpu()[constant, None].to(x.dtype).float().expand_as(y_c[constant])), \
        f"{what}: a constant channel's y must be its bias"
