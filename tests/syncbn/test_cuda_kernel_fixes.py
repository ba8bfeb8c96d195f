"""Regression tests for CUDA kernel defects; each test failed on the kernels before the fix it guards:

- Statistics at extreme magnitudes: the Chan merge computed `d * d * cross` with cross = 0 on a thread's first
  chunk, so for |mean| above sqrt(FLT_MAX) (~1.8e19) in fp32/bf16 `d * d` was inf and inf * 0 made the channel's M2
  NaN; and a thread's float32 sums overflowed (|x - k| beyond ~1e19) or lost their squares to underflow (below
  ~1e-19), so statistics were NaN or wrong from there to float max. Now finite and within 1e-6 of float64 up to
  float max, constant channels exact (extreme_cases.py), as the CPU kernels (test_kernels.py).
- float64 statistics merged threads' and blocks' running means of |mean| ~ 1e8 and lost 1e-9 of the variance there
  (1e5x nn.BatchNorm's float64 error); now merged relative to each channel's first value.
- The gather fused each n * mean into its sum (nvcc contracts to an fma), so at rank means of +-3e38 its mean
  differed from the two all_reduces' (the emulated build, compiled without contraction, could not show it).
- block_reduce assumed exactly 256 threads (it merged 8 warp slots whatever the block held).
- A NaN global count (batch_norm_gather_stats' signal for invalid rows) gave dx = 0 in backward_elemt
  instead of NaN, so the backward silently disagreed with the forward.

Emulated build in every `make test` (marked `cuda_emulated`); on a GPU too (marked `cuda`).
"""
from __future__ import annotations

import pytest
import torch

from src.syncbn.extension import load_extension
from tests.syncbn import extreme_cases as xc
from tests.syncbn import precision_cases as pc
from tests.syncbn.cuda_cases import BACKENDS, H100, ORIN, ORIN1, load_backend, one_intraop_thread


@pytest.fixture(scope="module", params=BACKENDS)
def kb(request):
    """The backend the kernels run on (emulated on the CPU, or a GPU); torch's CPU ops on one thread."""
    backend = load_backend(request.param)
    backend.use(H100)
    with one_intraop_thread():
        yield backend
    backend.use(H100)


@pytest.fixture(scope="module")
def cpu_ops():
    """Our CPU kernels, which the NaN-count test compares with."""
    return load_extension()


def _in_layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last) if layout == "channels_last" else x.contiguous()


# (shape, memory format, emulated device): each walk of the statistics kernel (cuda_cases.py says what each
# exercises), vectorised or not, and both with the partials' second kernel (the two ORIN cases).
EXTREME_CASES = [
    ((2, 8, 8, 8), torch.contiguous_format, H100),
    ((24, 8, 9, 11), torch.contiguous_format, ORIN1),
    ((24, 40, 5, 6), torch.channels_last, ORIN1),
    ((3000, 6), torch.contiguous_format, ORIN1),
    ((32, 4, 3, 4, 5), torch.channels_last_3d, ORIN1),
    ((96, 16, 8, 8), torch.channels_last, ORIN1),
    ((2, 4, 128, 128), torch.contiguous_format, ORIN),
]
EXTREME_IDS = [f"{'x'.join(map(str, s))}-{str(f).split('.')[-1]}-{d.replace(',sm_count=', '-sm')}"
               for s, f, d in EXTREME_CASES]


@pytest.mark.parametrize("dtype", xc.DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("case", EXTREME_CASES, ids=EXTREME_IDS)
def test_statistics_finite_to_float_max(kb, case, dtype):
    """Constant, near-constant and spread channels from the dtype's tiny end to its max (extreme_cases.py)."""
    shape, fmt, device = case
    kb.use(device)
    for magnitude in xc.MAGNITUDES[dtype]:
        x = xc.make(shape, fmt, dtype, magnitude, kb.device)
        what = f"{shape} {fmt} {dtype} at {magnitude:g}"
        xc.check_stats(kb.ops.batch_norm_stats(x), x, what)
        xc.check_forward_backward(kb.ops, x, what)


@pytest.mark.parametrize("layout", ["nc_2048", "nchw", "channels_last"])
def test_float64_statistics_as_precise_as_batchnorm(kb, layout):
    """float64 at |mean| / std = 1e8, one SM (threads fold many chunks, blocks merge): the statistics' mean and unbiased
    variance within 10x of nn.BatchNorm's float64 CPU error, against exact values (precision_cases.py)."""
    kb.use(ORIN1)
    x = pc.make_float64(layout, 1e8)
    c = x.shape[1]
    n = x.numel() // c
    stats = kb.ops.batch_norm_stats(x.to(kb.device)).cpu()
    for what, (ours, theirs) in pc.float64_errors(x, stats[1:1 + c], stats[1 + c:] / (n - 1)).items():
        assert ours <= 10 * theirs, f"{layout} {what}: relative error {ours:.3g}, nn.BatchNorm's {theirs:.3g}"


@pytest.mark.parametrize("rows", list(xc.FLOAT_MAX_ROWS))
def test_gather_merges_as_the_all_reduces_do_at_float_max(kb, rows):
    """Rank means of +-3e38: the gather adds the very terms the two all_reduces add (each n * mean rounded on its own,
    never an fma), so both give the same mean (extreme_cases.py)."""
    xc.check_gather_matches_all_reduces(kb.ops, rows, kb.device)


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_backward_elemt_nan_count_gives_nan(kb, cpu_ops, layout, dtype):
    """A NaN count (invalid gathered rows) makes every dx NaN, as the forward's outputs are and the CPU op gives."""
    x = _in_layout(torch.randn(4, 8, 3, 3, dtype=torch.float64).to(dtype), layout).to(kb.device)
    dy = _in_layout(torch.randn(4, 8, 3, 3, dtype=torch.float64).to(dtype), layout).to(kb.device)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    mean, invstd = torch.zeros(8, dtype=acc, device=kb.device), torch.ones(8, dtype=acc, device=kb.device)
    red = torch.ones(16, dtype=acc, device=kb.device)
    nan = torch.full((), float("nan"), dtype=torch.float64, device=kb.device)
    dx = kb.ops.batch_norm_backward_elemt(dy, x, mean, invstd, None, red, nan)
    assert torch.isnan(dx.cpu()).all(), f"{int((~torch.isnan(dx.cpu())).sum())} of {dx.numel()} dx values not NaN"
    cpu_dx = cpu_ops.batch_norm_backward_elemt(dy.cpu(), x.cpu(), mean.cpu(), invstd.cpu(), None, red.cpu(), nan.cpu())
    assert torch.isnan(cpu_dx).all()


def test_backward_elemt_nan_count_from_gather(kb):
    """End to end: a negative gathered count -> NaN count from gather -> NaN dx (never a silent 0)."""
    x = torch.randn(4, 3, 5, device=kb.device)
    st = kb.ops.batch_norm_stats(x)
    rows = torch.stack([st, st]).clone()
    rows[1, 0] = -1.0
    mean, invstd, count = kb.ops.batch_norm_gather_stats(rows, None, None, None, 0.1, xc.EPS, False)
    assert torch.isnan(count.cpu())
    red = kb.ops.batch_norm_backward_reduce(x, x, torch.zeros(3, device=kb.device), torch.ones(3, device=kb.device))
    dx = kb.ops.batch_norm_backward_elemt(x, x, mean, invstd, None, red, count)
    assert torch.isnan(dx.cpu()).all()


@pytest.mark.cuda_emulated
@pytest.mark.parametrize("group", [1, 4])
def test_block_reduce_other_block_sizes(group):
    """block_reduce merges exactly the warps the block has: 256 threads, then fewer whole warps (whose unused
    shared slots still hold the previous launch's values), each sum and count exact."""
    from src.syncbn.extension import load_emulated_cuda_extension

    probes = load_emulated_cuda_extension(H100).probes
    for threads in (256, 128, 96, 32, 256, 64):
        values = torch.arange(2 * threads, dtype=torch.float64).view(2, threads) + 1000.0 * threads
        out = probes.block_reduce_sum(values, group)
        cols = values.view(2, threads // group, group)
        torch.testing.assert_close(out[..., 0], cols.sum(1), rtol=0.0, atol=0.0,
                                   msg=lambda m: f"sums, {threads} threads, group {group}: {m}")
        assert torch.equal(out[..., 1], torch.full((2, group), float(threads // group), dtype=torch.float64)), \
            f"counts, {threads} threads, group {group}: {out[..., 1]}"


@pytest.mark.cuda_emulated
@pytest.mark.parametrize("threads", [288, 512, 48])
def test_block_reduce_unsupported_block_gives_nan(threads):
    """More than kThreads (the shared slots would overrun) or a partial warp (the full-mask shuffles would be
    undefined): the device-side guard makes the result NaN, never a plausible wrong number."""
    from src.syncbn.extension import load_emulated_cuda_extension

    probes = load_emulated_cuda_extension(H100).probes
    out = probes.block_reduce_sum(torch.ones(1, threads, dtype=torch.float64), 1)
    assert torch.isnan(out).all(), out
