"""The compiled CPU kernels, op by op, against the float64 reference in tests/syncbn/reference_ops.py.

Tolerances (per dtype, why):
- float64: ~1e-12 relative; the kernels accumulate in float64, only summation order differs.
- float32: statistics and reductions accumulate in fp32 per tile and in float64 across tiles, so
  ~1e-5 relative; elementwise outputs are fp32 values of O(1-10): 2e-5 absolute.
- bfloat16 / float16 outputs: the reference rounds its float64 result to the same dtype, ours rounds
  an fp32 result, so they may differ by one unit in the last place: eps = 2^-7 (bf16), 2^-10 (f16);
  we allow 2 eps relative. Their statistics are exact fp32 sums of exactly representable values: 1e-5.
"""
from __future__ import annotations

import pytest
import torch

from src.syncbn.extension import load_extension
from tests.support import process_state
from tests.syncbn import extreme_cases as xc
from tests.syncbn import precision_cases as pc
from tests.syncbn import reference_ops as ref

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
OUT_RTOL = {torch.float64: 1e-12, torch.float32: 2e-6, torch.bfloat16: 2 * 2**-7, torch.float16: 2 * 2**-10}
OUT_ATOL = {torch.float64: 1e-12, torch.float32: 2e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}
ACC_RTOL = {torch.float64: 1e-11, torch.float32: 1e-5, torch.bfloat16: 1e-5, torch.float16: 1e-5}

# name -> (shape, memory format). Sizes are odd on purpose (not multiples of any vector width), and
# a few are large enough to cross tile boundaries and use both threads.
LAYOUTS = {
    "nchw": ((5, 7, 9, 11), torch.contiguous_format),
    "nchw_many_tiles": ((2, 3, 97, 101), torch.contiguous_format),
    "nchw_one_channel": ((6, 1, 13, 17), torch.contiguous_format),
    "channels_last": ((4, 35, 6, 7), torch.channels_last),
    "channels_last_many_rows": ((16, 19, 33, 31), torch.channels_last),
    "channels_last_3d": ((2, 19, 3, 4, 5), torch.channels_last_3d),
    "nc": ((33, 21), torch.contiguous_format),
    "ncl": ((3, 6, 37), torch.contiguous_format),
}


@pytest.fixture(scope="session")
def ops():
    """The compiled extension, built at most once per session (then cached on disk)."""
    return load_extension()


def make_input(shape, fmt, dtype, *, mean=3.0, std=2.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * std + mean
    return x.to(dtype).contiguous(memory_format=fmt)


def channel_params(c, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(c, generator=g) * 0.5 + 1.0, torch.randn(c, generator=g)


def assert_stats_close(ours, theirs, dtype):
    c = (theirs.numel() - 1) // 2
    assert ours.dtype == torch.float64 and ours.shape == theirs.shape
    assert ours[0].item() == theirs[0].item()  # counts are exact
    rtol = ACC_RTOL[dtype]
    m2 = theirs[1 + c :]
    std = (m2 / theirs[0].clamp(min=1)).sqrt()
    torch.testing.assert_close(ours[1 : 1 + c], theirs[1 : 1 + c], rtol=0, atol=float(rtol * (std.max() + 1)))
    torch.testing.assert_close(ours[1 + c :], m2, rtol=rtol, atol=rtol * float(m2.max()) * 1e-3 + 1e-12)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no_affine"])
def test_ops_match_reference(ops, layout, dtype, affine):
    shape, fmt = LAYOUTS[layout]
    x = make_input(shape, fmt, dtype)
    dy = make_input(shape, fmt, dtype, mean=0.1, std=1.0, seed=2)
    weight, bias = channel_params(shape[1]) if affine else (None, None)

    stats = ops.batch_norm_stats(x)
    assert_stats_close(stats, ref.batch_norm_stats(x), dtype)

    gathered = torch.stack([stats, ref.batch_norm_stats(make_input(shape, fmt, dtype, seed=5))])
    acc_double = dtype == torch.float64
    mean, invstd, count = ops.batch_norm_gather_stats(gathered, None, None, None, 0.1, 1e-5, acc_double)
    rmean, rinvstd, rcount = ref.batch_norm_gather_stats(gathered, None, None, None, 0.1, 1e-5, acc_double)
    assert mean.dtype == rmean.dtype and invstd.dtype == rinvstd.dtype and count.dtype == torch.float64
    torch.testing.assert_close(mean, rmean, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(invstd, rinvstd, rtol=1e-6, atol=0)
    assert count.item() == rcount.item() and count.dim() == 0

    y = ops.batch_norm_elemt(x, weight, bias, mean, invstd)
    ry = ref.batch_norm_elemt(x, weight, bias, mean, invstd)
    assert y.dtype == dtype and y.stride() == x.stride() and y.is_contiguous(memory_format=fmt)
    torch.testing.assert_close(y, ry, rtol=OUT_RTOL[dtype], atol=OUT_ATOL[dtype])

    reduced = ops.batch_norm_backward_reduce(dy, x, mean, invstd)
    rreduced = ref.batch_norm_backward_reduce(dy, x, mean, invstd)
    assert reduced.dtype == rreduced.dtype and reduced.shape == (2 * shape[1],)
    scale = float(rreduced.abs().max()) + 1.0
    torch.testing.assert_close(reduced, rreduced, rtol=0, atol=ACC_RTOL[dtype] * scale)

    dx = ops.batch_norm_backward_elemt(dy, x, mean, invstd, weight, reduced, count)
    rdx = ref.batch_norm_backward_elemt(dy, x, mean, invstd, weight, reduced, count)
    assert dx.dtype == dtype and dx.stride() == x.stride()
    torch.testing.assert_close(dx, rdx, rtol=OUT_RTOL[dtype], atol=OUT_ATOL[dtype])


@pytest.mark.parametrize("layout", ["nchw", "channels_last", "nc"])
def test_thread_count_does_not_change_results_beyond_rounding(ops, layout):
    # One thread against two, both set here: the count this process happens to have could be one as well.
    shape, fmt = LAYOUTS[layout]
    x = make_input(shape, fmt, torch.float64)
    stats = {}
    with process_state.restoring("torch intra-op threads"):
        for threads in (1, 2):
            torch.set_num_threads(threads)
            assert torch.get_num_threads() == threads
            stats[threads] = ops.batch_norm_stats(x)
    torch.testing.assert_close(stats[2], stats[1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("layout", ["nchw_many_tiles", "channels_last_many_rows"])
def test_large_mean_variance_is_stable(ops, layout, dtype):
    # |mean| = 1e4 * std: fp32 sum/sum-of-squares would lose every digit of the variance here.
    shape, fmt = LAYOUTS[layout]
    x = make_input(shape, fmt, dtype, mean=1e4, std=1.0)
    ours, theirs = ops.batch_norm_stats(x), ref.batch_norm_stats(x)
    c = shape[1]
    var_ours, var_ref = ours[1 + c :] / ours[0], theirs[1 + c :] / theirs[0]
    rel = ((var_ours - var_ref).abs() / var_ref).max().item()
    assert rel < (1e-5 if dtype == torch.float32 else 1e-12), rel
    torch.testing.assert_close(ours[1 : 1 + c], theirs[1 : 1 + c], rtol=1e-9, atol=1e-4)


@pytest.mark.parametrize("layout,dtype,ratio", pc.CASES, ids=pc.CASE_IDS)
def test_variance_as_precise_as_torch_var_mean(ops, layout, dtype, ratio):
    """Every layout, |mean| / std up to 1e6: within 10x of torch.var_mean's float32 error (precision_cases.py)."""
    x = pc.make(layout, dtype, ratio)
    ours, theirs = pc.variance_errors(ops.batch_norm_stats(x), x)
    assert ours <= 10 * theirs, f"variance relative error {ours:.3g}, torch.var_mean's {theirs:.3g}"


# name -> (shape, memory format) for the extreme magnitudes: every walk of the statistics kernel, each with vectorised
# and leftover channels or values, and several tiles (a plane longer than one tile; rows over three tiles).
EXTREME_LAYOUTS = {
    "nchw": ((2, 8, 9, 11), torch.contiguous_format),
    "nchw_3x3": ((40, 8, 3, 3), torch.contiguous_format),
    "nchw_long_plane": ((1, 4, 70, 120), torch.contiguous_format),
    "ncl": ((5, 8, 37), torch.contiguous_format),
    "ncdhw": ((2, 4, 3, 4, 5), torch.contiguous_format),
    "nc": ((150, 40), torch.contiguous_format),
    "channels_last": ((3, 40, 5, 6), torch.channels_last),
    "channels_last_3d": ((2, 40, 3, 2, 4), torch.channels_last_3d),
}


@pytest.mark.parametrize("dtype", xc.DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("layout", list(EXTREME_LAYOUTS))
def test_statistics_finite_to_float_max(ops, layout, dtype):
    """Constant, near-constant and spread channels from the dtype's tiny end to its max (extreme_cases.py)."""
    shape, fmt = EXTREME_LAYOUTS[layout]
    for magnitude in xc.MAGNITUDES[dtype]:
        x = xc.make(shape, fmt, dtype, magnitude)
        what = f"{layout} {dtype} at {magnitude:g}"
        xc.check_stats(ops.batch_norm_stats(x), x, what)
        xc.check_forward_backward(ops, x, what)


@pytest.mark.parametrize("rows", list(xc.FLOAT_MAX_ROWS))
def test_gather_merges_as_the_all_reduces_do_at_float_max(ops, rows):
    """Rank means of +-3e38: the gather adds the very terms the two all_reduces add (each n * mean rounded on its own,
    never fused into the sum), so both give the same mean (extreme_cases.py)."""
    xc.check_gather_matches_all_reduces(ops, rows)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("shape,fmt", [((0, 4, 3, 3), torch.contiguous_format), ((0, 4, 3, 3), torch.channels_last),
                                       ((0, 5), torch.contiguous_format), ((2, 3, 0), torch.contiguous_format)])
def test_empty_input(ops, shape, fmt, dtype):
    x = torch.empty(shape, dtype=dtype).contiguous(memory_format=fmt)
    c = shape[1]
    stats = ops.batch_norm_stats(x)
    assert torch.equal(stats, torch.zeros(2 * c + 1, dtype=torch.float64))
    mean, invstd = torch.zeros(c), torch.ones(c)
    y = ops.batch_norm_elemt(x, None, None, mean, invstd)
    assert y.shape == x.shape and y.dtype == dtype and y.stride() == x.stride()
    reduced = ops.batch_norm_backward_reduce(x, x, mean, invstd)
    assert torch.equal(reduced, torch.zeros(2 * c, dtype=torch.float64 if dtype == torch.float64 else torch.float32))
    dx = ops.batch_norm_backward_elemt(x, x, mean, invstd, None, reduced, torch.tensor(0.0, dtype=torch.float64))
    assert dx.shape == x.shape and dx.dtype == dtype


def test_single_element(ops):
    x = torch.tensor([[2.5]])
    assert ops.batch_norm_stats(x).tolist() == [1.0, 2.5, 0.0]


def test_gather_stats_zero_count_rows_and_running_stats(ops):
    c = 3
    rows = [ref.batch_norm_stats(make_input((4, c, 5), torch.contiguous_format, torch.float64, seed=s)) for s in (1, 2)]
    empty = torch.zeros(2 * c + 1, dtype=torch.float64)
    gathered = torch.stack([rows[0], empty, rows[1]])
    for momentum, nbt in [(0.1, None), (-1.0, torch.tensor(3))]:
        for rdtype in (torch.float32, torch.float64):
            rm, rv = torch.full((c,), 0.5, dtype=rdtype), torch.full((c,), 2.0, dtype=rdtype)
            rm2, rv2 = rm.clone(), rv.clone()
            out = ops.batch_norm_gather_stats(gathered, rm, rv, nbt, momentum, 1e-5, False)
            want = ref.batch_norm_gather_stats(gathered, rm2, rv2, nbt, momentum, 1e-5, False)
            for a, b in zip(out, want):
                torch.testing.assert_close(a, b.to(a.dtype), rtol=1e-6, atol=1e-7)
            torch.testing.assert_close(rm, rm2, rtol=1e-6, atol=1e-7)
            torch.testing.assert_close(rv, rv2, rtol=1e-6, atol=1e-7)
    # Whole group empty: zeros, count 0, running stats untouched.
    rm, rv = torch.full((c,), 0.5), torch.full((c,), 2.0)
    mean, invstd, count = ops.batch_norm_gather_stats(torch.stack([empty, empty]), rm, rv, None, 0.1, 1e-5, True)
    assert mean.dtype == torch.float64 and not mean.any() and not invstd.any() and count.item() == 0
    assert torch.equal(rm, torch.full((c,), 0.5)) and torch.equal(rv, torch.full((c,), 2.0))


def test_gather_stats_merge_equals_whole_batch(ops):
    # Chan's merge of uneven parts equals the statistics of the concatenated batch.
    parts = [make_input((n, 4, 3), torch.contiguous_format, torch.float64, mean=1e3, seed=n) for n in (1, 5, 2)]
    gathered = torch.stack([ops.batch_norm_stats(p) for p in parts])
    mean, invstd, count = ops.batch_norm_gather_stats(gathered, None, None, None, 0.1, 1e-5, True)
    whole = torch.cat(parts)
    torch.testing.assert_close(mean, whole.mean((0, 2)), rtol=1e-13, atol=0)
    torch.testing.assert_close(invstd, (whole.var((0, 2), unbiased=False) + 1e-5).rsqrt(), rtol=1e-11, atol=0)
    assert count.item() == whole.numel() / 4


def test_backward_elemt_zero_count_gives_zeros(ops):
    x = make_input((2, 3, 4), torch.contiguous_format, torch.float32)
    dx = ops.batch_norm_backward_elemt(x, x, torch.zeros(3), torch.zeros(3), None, torch.zeros(6),
                                       torch.tensor(0.0, dtype=torch.float64))
    assert torch.equal(dx, torch.zeros_like(x))


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda o: o.batch_norm_stats(torch.randn(5)), "at least 2 dims"),
        (lambda o: o.batch_norm_stats(torch.arange(6).view(2, 3)), "dtype Long is not supported"),
        (lambda o: o.batch_norm_stats(torch.randn(2, 3, 4, 5).transpose(2, 3)), "neither contiguous nor channels_last"),
        (lambda o: o.batch_norm_elemt(torch.randn(2, 3, 4), None, None, torch.zeros(4), torch.ones(3)),
         "mean must be a 1-D tensor of 3 values"),
        (lambda o: o.batch_norm_elemt(torch.randn(2, 3, 4), torch.ones(2), None, torch.zeros(3), torch.ones(3)),
         "weight must be a 1-D tensor of 3 values"),
        (lambda o: o.batch_norm_backward_reduce(torch.randn(2, 3, 4).double(), torch.randn(2, 3, 4),
                                                torch.zeros(3), torch.ones(3)), "does not match input dtype"),
        (lambda o: o.batch_norm_backward_reduce(torch.randn(2, 3, 4, 4),
                                                torch.randn(2, 3, 4, 4).contiguous(memory_format=torch.channels_last),
                                                torch.zeros(3), torch.ones(3)), "must have the input's memory format"),
        (lambda o: o.batch_norm_backward_elemt(torch.randn(2, 3, 4), torch.randn(2, 3, 4), torch.zeros(3),
                                               torch.ones(3), None, torch.zeros(5), torch.tensor(8.0)),
         "reduced must be a 1-D tensor of 6 values"),
        (lambda o: o.batch_norm_gather_stats(torch.zeros(2, 6, dtype=torch.float64), None, None, None, 0.1, 1e-5, False),
         r"\[world_size, 2\*C\+1\]"),
        (lambda o: o.batch_norm_gather_stats(torch.ones(1, 7, dtype=torch.float64), torch.zeros(3), torch.ones(3),
                                             None, -1.0, 1e-5, False), "needs num_batches_tracked"),
    ],
    ids=["1d", "int", "strided", "mean_shape", "weight_shape", "dy_dtype", "dy_format", "reduced_shape",
         "gathered_shape", "cumulative_without_nbt"],
)
def test_errors_say_what_is_wrong(ops, call, match):
    with pytest.raises(RuntimeError, match=match):
        call(ops)
