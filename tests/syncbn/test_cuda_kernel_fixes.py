"""Regression tests for three CUDA kernel defects found by reading csrc/cuda/ against PyTorch's
Normalization.cuh; each test failed on the kernels before the fix it guards:

- Welford overflow: the Chan merge computed `d * d * cross` with cross = 0 on a thread's first chunk, so for
  |mean| above sqrt(FLT_MAX) (~1.8e19) in fp32/bf16 `d * d` was inf and inf * 0 made the channel's M2 NaN.
- block_reduce assumed exactly 256 threads (it merged 8 warp slots whatever the block held).
- A NaN global count (batch_norm_gather_stats' signal for invalid rows) gave dx = 0 in backward_elemt
  instead of NaN, so the backward silently disagreed with the forward.

Emulated build in every `make test` (marked `cuda_emulated`); on a GPU too (marked `cuda`).
"""
from __future__ import annotations

import pytest
import torch

from src.syncbn.extension import load_extension
from tests.syncbn import reference_ops as ref
from tests.syncbn.cuda_cases import BACKENDS, EPS, H100, load_backend, one_intraop_thread


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
    """Our CPU kernels (they merge in float64, so they never had the overflow)."""
    return load_extension()


def _in_layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last) if layout == "channels_last" else x.contiguous()


def _huge(shape, magnitude: float, dtype: torch.dtype, spread: float, device: str) -> torch.Tensor:
    """magnitude * sign_c * (1 + spread * k), k in {-1, 0, 1} at random; alternate channels negative."""
    gen = torch.Generator().manual_seed(3)
    k = torch.randint(-1, 2, shape, generator=gen, dtype=torch.float64)
    sign = torch.tensor([1.0 if c % 2 == 0 else -1.0 for c in range(shape[1])], dtype=torch.float64)
    return (magnitude * sign.view(1, -1, 1, 1) * (1 + spread * k)).to(dtype).to(device)


# (magnitude, relative spread). spread 0: constant channels, whose M2 is exactly 0 in any precision (every
# chunk mean of equal values is exact). Near-constant cases keep M2 = n * (magnitude * spread)^2 within the
# accumulator's range: below FLT_MAX (3.4e38) for fp32/bf16, so only up to a few 1e19 there (the spread
# cannot be smaller than a bf16/fp32 ulp); float64 takes 1e30 with spread 1e-9.
MAGNITUDES = [1e19, 3e19, 1e20, 1e25, 1e30]
CASES = ([(m, 0.0, dt) for m in MAGNITUDES for dt in (torch.float32, torch.bfloat16, torch.float64)]
         + [(3e19, 2.0**-7, dt) for dt in (torch.float32, torch.bfloat16)]
         + [(m, 1e-9, torch.float64) for m in (3e19, 1e30)])
SHAPES = [(4, 8, 8, 8), (6, 5, 3, 7)]  # vectorised in both layouts; scalar (C = 5, S = 21)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("magnitude,spread,dtype", CASES, ids=[f"{m:g}-{s:g}-{str(d)[6:]}" for m, s, d in CASES])
def test_stats_huge_magnitude(kb, cpu_ops, shape, layout, magnitude, spread, dtype):
    """Finite, correct mean and M2 for |mean| in 1e19..1e30: vs float64 on the same values and the CPU kernels."""
    x = _in_layout(_huge(shape, magnitude, dtype, spread, kb.device), layout)
    out = kb.ops.batch_norm_stats(x).cpu()
    exp = ref.batch_norm_stats(x.cpu())
    cpu = cpu_ops.batch_norm_stats(x.cpu())
    c = shape[1]
    assert torch.isfinite(out).all(), f"non-finite stats: {out}"
    assert float(out[0]) == float(exp[0])
    # Mean: fp32 accumulation of equal-sign values loses ~n * 2^-24 relative (n <= 256 per thread chain and
    # merges in float64 afterwards); 1e-5 relative is 100x that. float64: 1e-12.
    rtol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(out[1:1 + c], exp[1:1 + c], rtol=rtol, atol=0.0)
    torch.testing.assert_close(cpu[1:1 + c], exp[1:1 + c], rtol=rtol, atol=0.0)
    if spread == 0.0:
        assert torch.equal(out[1 + c:], torch.zeros(c, dtype=out.dtype)), "constant channels must have M2 = 0"
    else:
        # M2 is accumulated around each chunk's own mean (no cancellation): ~1e-6 relative in fp32; 1e-4
        # allows the float64 reference's own view of the rounded values. float64: 1e-9 (d ~ 1e-9 |mean|).
        m2_tol = 1e-6 if dtype == torch.float64 else 1e-4
        torch.testing.assert_close(out[1 + c:], exp[1 + c:], rtol=m2_tol, atol=0.0)


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_forward_normalises_huge_constant(kb, layout, dtype):
    """The whole forward (stats -> gather -> elemt) on a 1e20 constant gives y = bias, not NaN."""
    x = _in_layout(_huge((4, 8, 4, 4), 1e20, dtype, 0.0, kb.device), layout)
    st = kb.ops.batch_norm_stats(x)
    mean, invstd, _ = kb.ops.batch_norm_gather_stats(st.view(1, -1), None, None, None, 0.1, EPS, False)
    bias = torch.linspace(-1, 1, 8).to(kb.device)
    y = kb.ops.batch_norm_elemt(x, None, bias, mean, invstd)
    assert torch.equal(y.float().cpu(), bias.cpu().view(1, -1, 1, 1).expand(4, 8, 4, 4).to(dtype).float())


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
    mean, invstd, count = kb.ops.batch_norm_gather_stats(rows, None, None, None, 0.1, EPS, False)
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
