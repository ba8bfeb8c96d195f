"""The CUDA kernels (csrc/cuda/) op by op: against the float64 reference ops and against PyTorch's own
SyncBN kernels (torch.batch_norm_stats / _gather_stats_with_counts / _elemt / _backward_reduce /
_backward_elemt), across dtypes, layouts (every code path: vectorised and scalar, channels-first and
channels-last, one or several blocks per channel), empty batches and a large common offset; plus a
check that a training forward+backward never synchronises the host with the device.

Tolerances. The reference sees the very same (already rounded) input values in float64, so what is
left is the kernels' arithmetic: statistics and reductions accumulate in fp32 (fp64 for fp64 input)
over <= ~5e4 values per channel -> relative error a few 1e-6 (fp64: ~1e-15); we allow 1e-5 of the
data's scale (fp64: 1e-10). Elementwise outputs are computed in fp32 and rounded once to the input
dtype, so they may differ from the rounded float64 result by one rounding step: 2 ulps of the dtype.
"""
from __future__ import annotations

import pytest
import torch

from tests.syncbn import reference_ops as ref

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
ACC_TOL = {torch.float64: 1e-10}  # default 1e-5: fp32 accumulation
# (rtol, atol relative to the largest |expected|) for outputs in the input dtype: 2 ulps.
OUT_TOL = {torch.float64: (1e-10, 1e-10), torch.float32: (1e-5, 1e-5), torch.float16: (2.0**-9, 2.0**-10),
           torch.bfloat16: (2.0**-6, 2.0**-7)}
EPS = 1e-5

# (shape, layout): every branch of the launchers.
CASES = [
    ((4, 8, 5, 7), "contiguous"),       # S = 35: not a multiple of the vector width -> scalar path
    ((8, 16, 8, 8), "contiguous"),      # vectorised channels-first
    ((8, 16, 8, 8), "channels_last"),   # vectorised channels-last
    ((6, 5, 3, 7), "channels_last"),    # C = 5: scalar channels-last
    ((2, 6, 4, 3, 5), "channels_last"),  # channels_last_3d
    ((2, 6, 4, 3, 5), "contiguous"),
    ((37, 24), "contiguous"),           # plain (N, C): channels-last walk
    ((16, 3, 1, 1), "contiguous"),      # S == 1: contiguous and channels_last at once
    ((3, 40, 64), "transposed"),        # (N, L, C) memory viewed as (N, C, L): channels-last, no copy
    ((4, 8, 6, 10), "strided"),         # non-dense view: densified first
    ((8, 16, 8, 8), "misaligned"),      # data not 16-byte aligned: scalar path
    ((64, 32, 28, 28), "contiguous"),   # several blocks per channel: partials + finalize kernel
    ((256, 48, 10, 10), "channels_last"),
]
CASE_IDS = [f"{'x'.join(map(str, s))}-{lay}" for s, lay in CASES]


@pytest.fixture(scope="module")
def ops():
    """The compiled extension (CUDA variant on this machine)."""
    from src.syncbn.extension import load_extension

    return load_extension()


def make(shape, layout="contiguous", dtype=torch.float32, *, seed=0, loc=0.0, scale=1.0) -> torch.Tensor:
    """loc + scale * N(0, 1) + a per-channel offset (catches channel mix-ups), in the requested layout."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    if layout == "transposed":
        n, c, length = shape
        base = torch.randn(n, length, c, generator=gen, device="cuda", dtype=torch.float64).transpose(1, 2)
    else:
        base = torch.randn(shape, generator=gen, device="cuda", dtype=torch.float64)
    chan = torch.linspace(-1.0, 1.0, shape[1], device="cuda", dtype=torch.float64).view([1, -1] + [1] * (len(shape) - 2))
    vals = (base * scale + loc + chan * scale).to(dtype)  # elementwise ops keep base's strides
    if layout == "channels_last":
        return vals.contiguous(memory_format=torch.channels_last if len(shape) == 4 else torch.channels_last_3d)
    if layout == "strided":
        wide = torch.empty(*shape[:-1], 2 * shape[-1], device="cuda", dtype=dtype)
        wide[..., ::2] = vals
        return wide[..., ::2]
    if layout == "misaligned":
        flat = torch.empty(vals.numel() + 1, device="cuda", dtype=dtype)
        flat[1:] = vals.flatten()
        return flat[1:].view(shape)
    return vals


def acc_of(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def close(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol_rel: float, msg: str = "") -> None:
    """assert_close in float64 with atol scaled to the largest |expected| (tolerances are relative)."""
    scale = max(float(expected.double().abs().max()) if expected.numel() else 0.0, 1e-30)
    torch.testing.assert_close(actual.double(), expected.double(), rtol=rtol, atol=atol_rel * scale, msg=msg or None)


def global_stats(ops, x: torch.Tensor):
    """(mean, invstd, count) of x as the forward computes them (acc dtype)."""
    return ops.batch_norm_gather_stats(ops.batch_norm_stats(x).view(1, -1), None, None, None, 0.1, EPS,
                                       x.dtype == torch.float64)


def affine(c: int, mode: str, dtype: torch.dtype):
    """weight, bias: None, in the input dtype ('native'), or fp32 with a low-precision input ('fp32')."""
    if mode == "none":
        return None, None
    pdt = dtype if mode == "native" else torch.float32
    gen = torch.Generator(device="cuda").manual_seed(7)
    w = (torch.rand(c, generator=gen, device="cuda") + 0.5).to(pdt)
    b = torch.randn(c, generator=gen, device="cuda").to(pdt)
    return w, b


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,layout", CASES, ids=CASE_IDS)
def test_stats(ops, shape, layout, dtype):
    x = make(shape, layout, dtype)
    out = ops.batch_norm_stats(x)
    exp = ref.batch_norm_stats(x)
    c = shape[1]
    assert out.dtype == torch.float64 and out.shape == (2 * c + 1,) and out.device == x.device
    assert float(out[0]) == float(exp[0])  # counts are exact
    tol = ACC_TOL.get(dtype, 1e-5)
    n = float(exp[0])
    std = (exp[1 + c:] / n).sqrt()
    torch.testing.assert_close(out[1:1 + c], exp[1:1 + c], rtol=0.0, atol=float(tol * (exp[1:1 + c].abs() + std).max()))
    torch.testing.assert_close(out[1 + c:], exp[1 + c:], rtol=10 * tol, atol=1e-30)
    # PyTorch's kernel returns mean and invstd = 1/sqrt(var_biased + eps), in fp32 (fp64 for fp64).
    t_mean, t_invstd = torch.batch_norm_stats(x, EPS)
    torch.testing.assert_close(out[1:1 + c].to(t_mean.dtype), t_mean, rtol=10 * tol, atol=float(10 * tol * std.max()))
    ours_invstd = (out[1 + c:] / n + EPS).rsqrt().to(t_invstd.dtype)
    torch.testing.assert_close(ours_invstd, t_invstd, rtol=20 * tol, atol=0.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_stats_large_mean(ops, layout, dtype):
    """|mean| = 1e4 x std: naive fp32 sum(x^2) - n*mean^2 is off by O(1) here; Welford/Chan is not."""
    x = make((64, 8, 16, 16), layout, dtype, loc=1e4)
    out, exp = ops.batch_norm_stats(x), ref.batch_norm_stats(x)
    c = 8
    tol = 1e-10 if dtype == torch.float64 else 1e-3  # fp32 spacing near 1e4 is ~1e-3 of a std
    torch.testing.assert_close(out[1:1 + c], exp[1:1 + c], rtol=1e-6 if dtype == torch.float32 else 1e-12, atol=0.0)
    torch.testing.assert_close(out[1 + c:], exp[1 + c:], rtol=tol, atol=0.0)


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_empty_batch_every_op(ops, layout):
    x = make((0, 8, 4, 4), layout)
    st = ops.batch_norm_stats(x)
    assert st.shape == (17,) and st.dtype == torch.float64 and not st.any()
    mean = torch.zeros(8, device="cuda")
    invstd = torch.ones(8, device="cuda")
    y = ops.batch_norm_elemt(x, None, None, mean, invstd)
    assert y.shape == x.shape and y.stride() == x.stride()
    red = ops.batch_norm_backward_reduce(x, x, mean, invstd)
    assert red.shape == (16,) and red.dtype == torch.float32 and not red.any()
    count = torch.zeros((), dtype=torch.float64, device="cuda")
    dx = ops.batch_norm_backward_elemt(x, x, mean, invstd, None, red, count)
    assert dx.shape == x.shape
    assert ops.batch_norm_stats(torch.empty(0, 5, device="cuda")).abs().sum() == 0


@pytest.mark.parametrize("acc_double", [False, True])
@pytest.mark.parametrize("momentum", [0.1, -1.0], ids=["momentum0.1", "cumulative"])
@pytest.mark.parametrize("run_dtype", DTYPES, ids=str)
def test_gather_stats(ops, acc_double, momentum, run_dtype):
    """Uneven ranks (one empty) merge to the stats of the concatenated batch; running stats as the reference."""
    dtype = torch.float64 if acc_double else torch.float32
    x = make((15, 12, 3, 3), dtype=dtype, loc=3.0)
    pieces = torch.split(x, [5, 0, 9, 1])
    gathered = torch.stack([ops.batch_norm_stats(p) for p in pieces])
    rm = torch.randn(12, device="cuda").to(run_dtype)
    rv = (torch.rand(12, device="cuda") + 0.5).to(run_dtype)
    nbt = torch.tensor(3, device="cuda")
    rm_ref, rv_ref = rm.clone(), rv.clone()
    mean, invstd, count = ops.batch_norm_gather_stats(gathered, rm, rv, nbt, momentum, EPS, acc_double)
    e_mean, e_invstd, e_count = ref.batch_norm_gather_stats(gathered, rm_ref, rv_ref, nbt, momentum, EPS, acc_double)
    acc = torch.float64 if acc_double else torch.float32
    assert mean.dtype == invstd.dtype == acc and count.dtype == torch.float64 and count.dim() == 0
    assert float(count) == float(e_count) == 15 * 9
    tol = 1e-12 if acc_double else 1e-6
    torch.testing.assert_close(mean, e_mean, rtol=tol, atol=tol)
    torch.testing.assert_close(invstd, e_invstd, rtol=tol, atol=tol)
    # The reference rounds twice in run_dtype (mul_, add_), the kernel once: allow 2 ulps of run_dtype.
    rtol = {torch.float64: 1e-12, torch.float32: 1e-6, torch.float16: 2.0**-9, torch.bfloat16: 2.0**-6}[run_dtype]
    torch.testing.assert_close(rm, rm_ref, rtol=rtol, atol=rtol)
    torch.testing.assert_close(rv, rv_ref, rtol=rtol, atol=rtol)
    # The merge is exact: same as the statistics of the whole batch at once.
    w_mean, w_invstd, _ = global_stats(ops, x)
    torch.testing.assert_close(mean, w_mean.to(acc), rtol=tol * 10, atol=tol * 10)
    torch.testing.assert_close(invstd, w_invstd.to(acc), rtol=tol * 10, atol=tol * 10)
    if momentum >= 0 and run_dtype == acc:
        # PyTorch's merge (what nn.SyncBatchNorm runs, after masking out the empty rank on the host).
        keep = gathered[:, 0] > 0
        g = gathered[keep]
        means, m2 = g[:, 1:13].to(acc), g[:, 13:]
        invstds = (m2 / g[:, :1] + EPS).rsqrt().to(acc)
        t_rm, t_rv = rm_ref.clone(), rv_ref.clone()  # already updated once: compare the update, not state
        rm2, rv2 = t_rm.clone(), t_rv.clone()
        t_mean, t_invstd = torch.batch_norm_gather_stats_with_counts(
            x, means, invstds, t_rm, t_rv, momentum, EPS, g[:, 0].to(acc))
        ops.batch_norm_gather_stats(gathered, rm2, rv2, nbt, momentum, EPS, acc_double)
        torch.testing.assert_close(mean, t_mean, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(invstd, t_invstd, rtol=1e-4, atol=0.0)
        torch.testing.assert_close(rm2, t_rm, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(rv2, t_rv, rtol=1e-4, atol=1e-6)


def test_gather_stats_skips_empty_rows_and_all_empty(ops):
    """A zero-count row is ignored whatever it holds; an all-empty group gives zeros and no update."""
    x = make((6, 4, 5), loc=2.0)
    good = torch.stack([ops.batch_norm_stats(x[:2]), ops.batch_norm_stats(x[2:])])
    junk = torch.full((1, 9), float("nan"), dtype=torch.float64, device="cuda")
    junk[0, 0] = 0.0
    a = ops.batch_norm_gather_stats(good, None, None, None, 0.1, EPS, False)
    b = ops.batch_norm_gather_stats(torch.cat([junk, good, junk]), None, None, None, 0.1, EPS, False)
    for u, v in zip(a, b):
        torch.testing.assert_close(u, v, rtol=0, atol=0)
    rm, rv = torch.ones(4, device="cuda"), torch.ones(4, device="cuda")
    empty = torch.zeros(3, 9, dtype=torch.float64, device="cuda")
    mean, invstd, count = ops.batch_norm_gather_stats(empty, rm, rv, torch.tensor(1, device="cuda"), -1.0, EPS, False)
    assert float(count) == 0 and not mean.any() and not invstd.any()
    assert (rm == 1).all() and (rv == 1).all()


@pytest.mark.parametrize("mode", ["none", "native", "fp32"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,layout", CASES, ids=CASE_IDS)
def test_elemt(ops, shape, layout, dtype, mode):
    if mode == "fp32" and dtype in (torch.float32, torch.float64):
        pytest.skip("fp32 parameters are the native case for this dtype")
    x = make(shape, layout, dtype, loc=0.5)
    mean, invstd, _ = global_stats(ops, x)
    w, b = affine(shape[1], mode, dtype)
    y = ops.batch_norm_elemt(x, w, b, mean, invstd)
    assert y.dtype == x.dtype and y.shape == x.shape
    if layout == "strided":
        assert y.is_contiguous()
    else:
        assert y.stride() == x.stride()  # memory format kept, no hidden copy
    rtol, atol = OUT_TOL[dtype]
    close(y, ref.batch_norm_elemt(x, w, b, mean, invstd), rtol, atol)
    close(y, torch.batch_norm_elemt(x, w, b, mean, invstd, EPS), rtol, atol)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,layout", CASES, ids=CASE_IDS)
def test_backward_reduce(ops, shape, layout, dtype):
    x = make(shape, layout, dtype, loc=-0.5)
    dy = make(shape, layout, dtype, seed=1)
    mean, invstd, _ = global_stats(ops, x)
    out = ops.batch_norm_backward_reduce(dy, x, mean, invstd)
    c = shape[1]
    assert out.dtype == acc_of(dtype) and out.shape == (2 * c,)
    exp = ref.batch_norm_backward_reduce(dy, x, mean, invstd)
    tol = ACC_TOL.get(dtype, 1e-5)
    # Sums of ~n terms of size ~1: scale the tolerance by sum |dy| (what the rounding errors scale with).
    scale = float(ref.batch_norm_backward_reduce(dy.abs(), x, mean, invstd)[:c].max())
    torch.testing.assert_close(out, exp, rtol=tol, atol=tol * scale)
    t_dy, t_dyxmu, _, _ = torch.batch_norm_backward_reduce(dy, x, mean, invstd, None, True, False, False)
    torch.testing.assert_close(out[:c], t_dy.to(out.dtype), rtol=10 * tol, atol=10 * tol * scale)
    torch.testing.assert_close(out[c:], (t_dyxmu * invstd).to(out.dtype), rtol=10 * tol, atol=10 * tol * scale)


@pytest.mark.parametrize("mode", ["none", "native", "fp32"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,layout", CASES, ids=CASE_IDS)
def test_backward_elemt(ops, shape, layout, dtype, mode):
    if mode == "fp32" and dtype in (torch.float32, torch.float64):
        pytest.skip("fp32 parameters are the native case for this dtype")
    x = make(shape, layout, dtype, loc=0.25)
    dy = make(shape, layout, dtype, seed=2, loc=0.1)
    mean, invstd, count = global_stats(ops, x)
    w, _ = affine(shape[1], mode, dtype)
    reduced = ops.batch_norm_backward_reduce(dy, x, mean, invstd)
    dx = ops.batch_norm_backward_elemt(dy, x, mean, invstd, w, reduced, count)
    assert dx.dtype == x.dtype and dx.shape == x.shape
    assert dx.is_contiguous() if layout == "strided" else dx.stride() == x.stride()
    rtol, atol = OUT_TOL[dtype]
    close(dx, ref.batch_norm_backward_elemt(dy, x, mean, invstd, w, reduced, count), rtol, 4 * atol)
    c = shape[1]
    counts = torch.tensor([int(float(count))], dtype=torch.int32, device="cuda")
    t_dx = torch.batch_norm_backward_elemt(dy, x, mean, invstd, w, reduced[:c], reduced[c:] / invstd, counts)
    close(dx, t_dx, rtol, 4 * atol)


def test_backward_with_dy_in_another_layout(ops):
    """A contiguous grad_output for a channels_last input is re-laid out, not misread."""
    x = make((8, 16, 6, 6), "channels_last", loc=1.0)
    dy_cl = make((8, 16, 6, 6), "channels_last", seed=3)
    dy = dy_cl.contiguous()
    mean, invstd, count = global_stats(ops, x)
    red = ops.batch_norm_backward_reduce(dy, x, mean, invstd)
    torch.testing.assert_close(red, ops.batch_norm_backward_reduce(dy_cl, x, mean, invstd), rtol=1e-6, atol=1e-6)
    dx = ops.batch_norm_backward_elemt(dy, x, mean, invstd, None, red, count)
    assert dx.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(dx, ops.batch_norm_backward_elemt(dy_cl, x, mean, invstd, None, red, count))


def test_backward_elemt_zero_global_count(ops):
    x = make((4, 3, 5))
    mean, invstd = torch.zeros(3, device="cuda"), torch.ones(3, device="cuda")
    red = torch.ones(6, device="cuda")
    dx = ops.batch_norm_backward_elemt(x, x, mean, invstd, None, red, torch.zeros((), dtype=torch.float64, device="cuda"))
    assert not dx.any()


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_training_step_makes_no_host_sync(ops, layout):
    """Forward + backward through the ops (momentum=None included) and the module, with syncs as errors."""
    from src.syncbn import SyncBatchNorm2d

    x = make((8, 16, 10, 10), layout, loc=2.0)
    dy = make((8, 16, 10, 10), layout, seed=4)
    rm, rv = torch.zeros(16, device="cuda"), torch.ones(16, device="cuda")
    nbt = torch.zeros((), dtype=torch.long, device="cuda")
    module = SyncBatchNorm2d(16, momentum=None).cuda()
    xin = x.clone().requires_grad_()
    module(xin).backward(dy)  # warm-up: extension load, allocator, lazy init
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        nbt += 1
        stats = ops.batch_norm_stats(x)
        mean, invstd, count = ops.batch_norm_gather_stats(stats.view(1, -1), rm, rv, nbt, -1.0, EPS, False)
        ops.batch_norm_elemt(x, None, None, mean, invstd)
        red = ops.batch_norm_backward_reduce(dy, x, mean, invstd)
        ops.batch_norm_backward_elemt(dy, x, mean, invstd, None, red, count)
        module(xin).backward(dy)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()


def _big_enough(bytes_needed: int) -> bool:
    return torch.cuda.get_device_properties(0).total_memory > 3 * bytes_needed


def test_indexing_beyond_2_pow_31(ops):
    """More than 2^31 elements, channels-first and channels-last: offsets must be 64-bit."""
    length = 2**30 + 256  # 2 channels -> 2^31 + 512 elements per tensor
    if not _big_enough(4 * 2 * length * 2):
        pytest.skip("needs ~20 GB of GPU memory")
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(1, 2, length, generator=gen, device="cuda", dtype=torch.bfloat16) + 3).to(torch.bfloat16)
    for xin in (x, x[0].t()):  # (1, 2, L) channels-first; (L, 2) channels-last after one dense copy
        st = ops.batch_norm_stats(xin)
        for c in range(2):
            col = x[0, c].float()
            var, mean = torch.var_mean(col, correction=0)
            assert abs(float(st[1 + c]) - float(mean)) < 1e-4
            assert abs(float(st[3 + c]) / length - float(var)) < 1e-3
            del col
        mean = st[1:3].float()
        invstd = (st[3:5] / length + EPS).rsqrt().float()
        y = ops.batch_norm_elemt(xin, None, None, mean, invstd)
        if xin.dim() == 3:
            tail, tail_y = xin[0, 1, -1000:], y[0, 1, -1000:]
        else:
            tail, tail_y = xin[-1000:, 1], y[-1000:, 1]
        exp = (tail.float() - mean[1]) * invstd[1]
        torch.testing.assert_close(tail_y.float(), exp, rtol=2.0**-7, atol=2.0**-7)
        del y, st
