"""The CUDA kernels (csrc/cuda/) op by op, against the float64 reference ops, our CPU kernels and (on a GPU)
PyTorch's own SyncBN kernels (torch.batch_norm_stats / _gather_stats_with_counts / _elemt /
_backward_reduce / _backward_elemt), across dtypes, layouts and launch branches (cuda_cases.py).

Every case runs on the emulated build in every `make test` (marked `cuda_emulated`: CPU tensors through
the CUDA sources, every access bounds-checked, fresh memory poisoned with NaN) and on a real GPU where
there is one (marked `cuda`). test_cuda_launches.py checks that the cases reach the branches they are
there for; the GPU-only checks (no host synchronisation, > 2^31 elements) are at the end.
"""
from __future__ import annotations

import pytest
import torch

from src.syncbn.extension import load_extension
from tests.syncbn import precision_cases as pc
from tests.syncbn import reference_ops as ref
from tests.syncbn.cuda_cases import (ACC_TOL, BACKENDS, CASE_IDS, CASES, DTYPES, EPS, H100, ORIN1, OUT_TOL, acc_of,
                                     affine, close, load_backend, make, one_intraop_thread, to_cpu)


# (input dtype, affine parameters): none, in the input dtype, or fp32 with a 16-bit input (AMP).
AFFINE = [pytest.param(dt, mode, id=f"{dt}-{mode}") for dt in DTYPES for mode in ("none", "native", "fp32")
          if mode != "fp32" or dt in (torch.float16, torch.bfloat16)]


@pytest.fixture(scope="module", params=BACKENDS)
def kb(request):
    """The backend the kernels run on (emulated on the CPU, or a GPU); torch's CPU ops on one thread."""
    backend = load_backend(request.param)
    with one_intraop_thread():
        yield backend
    backend.release()


@pytest.fixture(scope="module")
def cpu_ops():
    """Our CPU kernels, the second opinion."""
    return load_extension()


@pytest.fixture(scope="module")
def inputs(kb) -> dict:
    """Kernel outputs that a test feeds to the op it checks, kept per backend (and schedule): test_elemt and
    test_backward_elemt run each case and dtype once per affine mode on the same x (and dy), so the statistics
    (and backward_reduce's sums) they normalise with are the same for every mode. Each is computed on the
    first mode and handed out as a copy to the others; the emulator is deterministic for a given schedule,
    so running the kernels again would give these very tensors. A pytest-xdist worker that gets another mode
    of the case computes them itself."""
    return {}


def shared(inputs: dict, key: tuple, compute) -> tuple:
    """compute() the first time `key` is asked for; every time, fresh copies (no test sees another's edits)."""
    if key not in inputs:  # copies kept: the ops' outputs live in the emulator's device-memory registry
        inputs[key] = tuple(t.clone() for t in compute())
    return tuple(t.clone() for t in inputs[key])


def global_stats(ops, x: torch.Tensor):
    """(mean, invstd, count) of x as the forward computes them (acc dtype)."""
    return ops.batch_norm_gather_stats(ops.batch_norm_stats(x).view(1, -1), None, None, None, 0.1, EPS,
                                       x.dtype == torch.float64)


def stats_close(out: torch.Tensor, exp: torch.Tensor, c: int, tol: float) -> None:
    """[count, mean, m2] against the expected: exact count, mean to tol x (|mean| + std), m2 to 10 tol."""
    out, exp = out.cpu(), exp.cpu()
    assert float(out[0]) == float(exp[0])  # counts are exact
    std = (exp[1 + c:] / max(float(exp[0]), 1.0)).sqrt()
    torch.testing.assert_close(out[1:1 + c], exp[1:1 + c], rtol=0.0, atol=float(tol * (exp[1:1 + c].abs() + std).max()))
    torch.testing.assert_close(out[1 + c:], exp[1 + c:], rtol=10 * tol, atol=1e-30)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,layout,device,why", CASES, ids=CASE_IDS)
def test_stats(kb, cpu_ops, shape, layout, device, why, dtype):
    kb.use(device)
    x = make(shape, layout, dtype, kb.device)
    out = kb.ops.batch_norm_stats(x)
    c = shape[1]
    assert out.dtype == torch.float64 and out.shape == (2 * c + 1,) and out.device == x.device
    assert not out.isnan().any()  # NaN: a slot no kernel wrote (fresh memory is NaN-poisoned)
    tol = ACC_TOL.get(dtype, 1e-5)
    stats_close(out, ref.batch_norm_stats(x), c, tol)
    stats_close(out.cpu(), cpu_ops.batch_norm_stats(x.cpu()), c, 2 * tol)
    if kb.device == "cuda":
        # PyTorch's kernel returns mean and invstd = 1/sqrt(var_biased + eps), in fp32 (fp64 for fp64).
        n = float(out[0])
        t_mean, t_invstd = torch.batch_norm_stats(x, EPS)
        std = (out[1 + c:] / n).sqrt()
        torch.testing.assert_close(out[1:1 + c].to(t_mean.dtype), t_mean, rtol=10 * tol, atol=float(10 * tol * std.max()))
        torch.testing.assert_close((out[1 + c:] / n + EPS).rsqrt().to(t_invstd.dtype), t_invstd, rtol=20 * tol, atol=0.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_stats_large_mean(kb, layout, dtype):
    """|mean| = 1e4 x std: naive fp32 sum(x^2) - n*mean^2 is off by O(1) here; Welford/Chan is not."""
    kb.use(H100)
    x = make((64, 8, 16, 16), layout, dtype, kb.device, loc=1e4)
    out, exp = kb.ops.batch_norm_stats(x), ref.batch_norm_stats(x)
    c = 8
    tol = 1e-10 if dtype == torch.float64 else 1e-3  # fp32 spacing near 1e4 is ~1e-3 of a std
    torch.testing.assert_close(out[1:1 + c], exp[1:1 + c], rtol=1e-6 if dtype == torch.float32 else 1e-12, atol=0.0)
    torch.testing.assert_close(out[1 + c:], exp[1 + c:], rtol=tol, atol=0.0)


@pytest.fixture(scope="module", params=[p for p in BACKENDS if p.values[0] != "emulated-reverse"])
def kb_forward(request):
    """As kb, without the reverse schedule: for arithmetic that does not depend on the order threads run in."""
    backend = load_backend(request.param)
    with one_intraop_thread():
        yield backend
    backend.release()


@pytest.mark.parametrize("device", [ORIN1, H100], ids=["orin-sm1", "h100"])
@pytest.mark.parametrize("layout,dtype,ratio", pc.CASES, ids=pc.CASE_IDS)
def test_variance_as_precise_as_torch_var_mean(kb_forward, layout, dtype, ratio, device):
    """Every layout, |mean| / std up to 1e6: within 10x of torch.var_mean's float32 error (precision_cases.py).
    On one SM each thread folds many chunks; on an H100 the blocks split the rows and a second kernel merges."""
    kb = kb_forward
    kb.use(device)
    x = pc.make(layout, dtype, ratio).to(kb.device)
    ours, theirs = pc.variance_errors(kb.ops.batch_norm_stats(x), x)
    assert ours <= 10 * theirs, f"variance relative error {ours:.3g}, torch.var_mean's {theirs:.3g}"


@pytest.mark.parametrize("shape,layout", [((0, 8, 4, 4), "contiguous"), ((0, 8, 4, 4), "channels_last"),
                                          ((4, 0), "contiguous"), ((0, 5), "transposed"), ((4, 0, 1, 1), "contiguous"),
                                          ((4, 0, 1, 1), "channels_last"), ((2, 3, 0), "contiguous"),
                                          ((0, 3, 2, 2, 2), "channels_last")])
def test_empty_inputs_every_op(kb, cpu_ops, shape, layout):
    """Empty batches, as PyTorch lays them out: (4, 0) has strides (1, 1), as has an empty rank's
    torch.empty(C, 0).t(); (4, 0, 1, 1) has (1, 1, 1, 1)."""
    if layout == "transposed":
        x = torch.empty(shape[::-1], device=kb.device).t()
    else:
        fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(len(shape)) if layout == "channels_last" else None
        x = torch.empty(shape, device=kb.device)
        x = x.contiguous(memory_format=fmt) if fmt else x
    c = x.shape[1]
    mean, invstd = torch.zeros(c, device=kb.device), torch.ones(c, device=kb.device)
    st = kb.ops.batch_norm_stats(x)
    assert st.shape == (2 * c + 1,) and st.dtype == torch.float64 and not st.any()
    y = kb.ops.batch_norm_elemt(x, None, None, mean, invstd)
    assert y.shape == x.shape and y.stride() == cpu_ops.batch_norm_elemt(*to_cpu(x, None, None, mean, invstd)).stride()
    red = kb.ops.batch_norm_backward_reduce(x, x, mean, invstd)
    assert red.shape == (2 * c,) and red.dtype == torch.float32 and not red.any()
    count = torch.zeros((), dtype=torch.float64, device=kb.device)
    dx = kb.ops.batch_norm_backward_elemt(x, x, mean, invstd, None, red, count)
    assert dx.shape == x.shape


@pytest.mark.parametrize("acc_double", [False, True])
@pytest.mark.parametrize("momentum", [0.1, -1.0], ids=["momentum0.1", "cumulative"])
@pytest.mark.parametrize("run_dtype", DTYPES, ids=str)
def test_gather_stats(kb, cpu_ops, acc_double, momentum, run_dtype):
    """Uneven ranks (one empty) merge to the stats of the concatenated batch; running stats as the reference."""
    kb.use(H100)
    dev = kb.device
    dtype = torch.float64 if acc_double else torch.float32
    x = make((15, 12, 3, 3), "contiguous", dtype, dev, loc=3.0)
    pieces = torch.split(x, [5, 0, 9, 1])
    gathered = torch.stack([kb.ops.batch_norm_stats(p) for p in pieces])
    gen = torch.Generator().manual_seed(3)
    rm = torch.randn(12, generator=gen).to(run_dtype).to(dev)
    rv = (torch.rand(12, generator=gen) + 0.5).to(run_dtype).to(dev)
    nbt = torch.tensor(3, device=dev)
    rm_ref, rv_ref, rm_cpu, rv_cpu = rm.clone(), rv.clone(), rm.cpu(), rv.cpu()
    mean, invstd, count = kb.ops.batch_norm_gather_stats(gathered, rm, rv, nbt, momentum, EPS, acc_double)
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
    c_mean, c_invstd, c_count = cpu_ops.batch_norm_gather_stats(*to_cpu(gathered, rm_cpu, rv_cpu, nbt), momentum, EPS,
                                                                acc_double)
    torch.testing.assert_close(mean.cpu(), c_mean, rtol=tol, atol=tol)
    torch.testing.assert_close(invstd.cpu(), c_invstd, rtol=tol, atol=tol)
    torch.testing.assert_close(rm.cpu(), rm_cpu, rtol=rtol, atol=rtol)
    torch.testing.assert_close(rv.cpu(), rv_cpu, rtol=rtol, atol=rtol)
    # The merge is exact: same as the statistics of the whole batch at once.
    w_mean, w_invstd, _ = global_stats(kb.ops, x)
    torch.testing.assert_close(mean, w_mean.to(acc), rtol=tol * 10, atol=tol * 10)
    torch.testing.assert_close(invstd, w_invstd.to(acc), rtol=tol * 10, atol=tol * 10)
    if momentum >= 0 and run_dtype == acc and dev == "cuda":
        # PyTorch's merge (what nn.SyncBatchNorm runs, after masking out the empty rank on the host).
        keep = gathered[:, 0] > 0
        g = gathered[keep]
        means, m2 = g[:, 1:13].to(acc), g[:, 13:]
        invstds = (m2 / g[:, :1] + EPS).rsqrt().to(acc)
        t_rm, t_rv = rm_ref.clone(), rv_ref.clone()  # already updated once: compare the update, not state
        rm2, rv2 = t_rm.clone(), t_rv.clone()
        t_mean, t_invstd = torch.batch_norm_gather_stats_with_counts(
            x, means, invstds, t_rm, t_rv, momentum, EPS, g[:, 0].to(acc))
        kb.ops.batch_norm_gather_stats(gathered, rm2, rv2, nbt, momentum, EPS, acc_double)
        torch.testing.assert_close(mean, t_mean, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(invstd, t_invstd, rtol=1e-4, atol=0.0)
        torch.testing.assert_close(rm2, t_rm, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(rv2, t_rv, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("channels", [1, 127, 128, 129, 300])
def test_gather_stats_channel_counts(kb, channels):
    """One thread per channel in 128-thread blocks: channel counts around a block boundary."""
    kb.use(H100)
    x = make((6, channels, 5), "contiguous", torch.float64, kb.device, loc=1.0)
    rows = torch.stack([kb.ops.batch_norm_stats(x[:2]), kb.ops.batch_norm_stats(x[2:])])
    rm, rv = torch.zeros(channels, device=kb.device), torch.ones(channels, device=kb.device)
    mean, invstd, count = kb.ops.batch_norm_gather_stats(rows, rm, rv, None, 0.5, EPS, True)
    e_rm, e_rv = torch.zeros(channels, device=kb.device), torch.ones(channels, device=kb.device)
    e_mean, e_invstd, _ = ref.batch_norm_gather_stats(rows, e_rm, e_rv, None, 0.5, EPS, True)
    torch.testing.assert_close(mean, e_mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(invstd, e_invstd, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rm, e_rm, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(rv, e_rv, rtol=1e-6, atol=1e-6)


def test_gather_stats_skips_empty_rows_and_all_empty(kb):
    """A zero-count row is ignored whatever it holds; an all-empty group gives zeros and no update."""
    kb.use(H100)
    dev = kb.device
    x = make((6, 4, 5), "contiguous", torch.float32, dev, loc=2.0)
    good = torch.stack([kb.ops.batch_norm_stats(x[:2]), kb.ops.batch_norm_stats(x[2:])])
    junk = torch.full((1, 9), float("nan"), dtype=torch.float64, device=dev)
    junk[0, 0] = 0.0
    a = kb.ops.batch_norm_gather_stats(good, None, None, None, 0.1, EPS, False)
    b = kb.ops.batch_norm_gather_stats(torch.cat([junk, good, junk]), None, None, None, 0.1, EPS, False)
    for u, v in zip(a, b):
        torch.testing.assert_close(u, v, rtol=0, atol=0)
    rm, rv = torch.ones(4, device=dev), torch.ones(4, device=dev)
    empty = torch.zeros(3, 9, dtype=torch.float64, device=dev)
    mean, invstd, count = kb.ops.batch_norm_gather_stats(empty, rm, rv, torch.tensor(1, device=dev), -1.0, EPS, False)
    assert float(count) == 0 and not mean.any() and not invstd.any()
    assert (rm == 1).all() and (rv == 1).all()


@pytest.mark.parametrize("loc,scale", [(3.0, 1.0), (1e30, 1e24), (-1e12, 1e-3)], ids=["3", "1e30", "-1e12"])
@pytest.mark.parametrize("channels", [3, 129])
def test_exchange_ops_are_the_gathers_merge(kb, cpu_ops, channels, loc, scale):
    """The forward's all_reduce exchange on 3 ranks (one empty), its sums taken as an all_reduce would: the same
    mean, invstd, count and running statistics as batch_norm_gather_stats of the same rows (the same terms, added
    in the same order here: equal but for a compiler's fused multiply-adds, 1e-15), at any magnitude; CUDA == CPU."""
    kb.use(H100)
    dev = kb.device
    x = make((7, channels, 5), "contiguous", torch.float64, dev, loc=loc, scale=scale)
    parts = [x[:3], x[3:3], x[3:]]  # the middle rank is empty
    stats = [kb.ops.batch_norm_stats(p) for p in parts]
    sums = [kb.ops.batch_norm_mean_sums(st) for st in stats]
    assert not sums[1].any()  # an empty rank adds exact zeros
    total = sums[0] + sums[1] + sums[2]
    devs = [kb.ops.batch_norm_deviation_sums(st, total) for st in stats]
    assert not devs[1].any()
    for st, sm, dv in zip(stats, sums, devs):
        torch.testing.assert_close(sm.cpu(), cpu_ops.batch_norm_mean_sums(st.cpu()), rtol=0, atol=0)
        torch.testing.assert_close(dv.cpu(), cpu_ops.batch_norm_deviation_sums(st.cpu(), total.cpu()), rtol=1e-15,
                                   atol=0)
    m2 = devs[0] + devs[1] + devs[2]
    for acc_double, momentum in ((True, 0.1), (False, -1.0)):
        run = [torch.full((channels,), 2.0, device=dev), torch.full((channels,), 3.0, device=dev)]
        gathered_run = [t.clone() for t in run]
        nbt = torch.tensor(4, device=dev)
        got = kb.ops.batch_norm_reduced_stats(total, m2, *run, nbt, momentum, EPS, acc_double)
        want = kb.ops.batch_norm_gather_stats(torch.stack(stats), *gathered_run, nbt, momentum, EPS, acc_double)
        cpu_run = [torch.full((channels,), 2.0), torch.full((channels,), 3.0)]
        cpu = cpu_ops.batch_norm_reduced_stats(total.cpu(), m2.cpu(), *cpu_run, nbt.cpu(), momentum, EPS, acc_double)
        for a, b, c in zip([*got, *run], [*want, *gathered_run], [*cpu, *cpu_run]):
            torch.testing.assert_close(a, b, rtol=1e-15, atol=0)
            # The CPU op rounds float32 running statistics twice (mul_, add_), the kernel once.
            torch.testing.assert_close(a.cpu(), c, rtol=1e-15 if a.dtype == torch.float64 else 2.0**-22, atol=0)
    # An all-empty group: zeros, no update; a NaN or negative count (a caller bug): NaN on the device, an error on
    # the CPU.
    zeros = torch.zeros(channels + 1, dtype=torch.float64, device=dev)
    rm, rv = torch.ones(channels, device=dev), torch.ones(channels, device=dev)
    mean, invstd, count = kb.ops.batch_norm_reduced_stats(zeros, zeros[1:], rm, rv, None, 0.1, EPS, False)
    assert float(count) == 0 and not mean.any() and not invstd.any() and (rm == 1).all() and (rv == 1).all()
    assert not kb.ops.batch_norm_deviation_sums(stats[0], zeros).any()
    for n in (float("nan"), -1.0):
        bad = zeros.clone()
        bad[0] = n
        mean, invstd, count = kb.ops.batch_norm_reduced_stats(bad, zeros[1:], rm, rv, None, 0.1, EPS, False)
        assert mean.isnan().all() and invstd.isnan().all() and count.isnan() and (rm == 1).all()
    with pytest.raises(RuntimeError, match="counts must be >= 0"):
        cpu_ops.batch_norm_reduced_stats(bad.cpu(), zeros[1:].cpu(), None, None, None, 0.1, EPS, False)


@pytest.mark.parametrize("dtype,mode", AFFINE)
@pytest.mark.parametrize("shape,layout,device,why", CASES, ids=CASE_IDS)
def test_elemt(kb, cpu_ops, inputs, shape, layout, device, why, dtype, mode):
    kb.use(device)
    x = make(shape, layout, dtype, kb.device, loc=0.5)
    mean, invstd, _ = shared(inputs, ("elemt", shape, layout, device, dtype), lambda: global_stats(kb.ops, x))
    w, b = affine(shape[1], mode, dtype, kb.device)
    y = kb.ops.batch_norm_elemt(x, w, b, mean, invstd)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert y.stride() == x.stride()  # memory format kept, no hidden copy
    rtol, atol = OUT_TOL[dtype]
    close(y, ref.batch_norm_elemt(x, w, b, mean, invstd), rtol, atol)
    close(y, cpu_ops.batch_norm_elemt(*to_cpu(x, w, b, mean, invstd)), 2 * rtol, 2 * atol)
    if kb.device == "cuda":
        close(y, torch.batch_norm_elemt(x, w, b, mean, invstd, EPS), rtol, atol)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,layout,device,why", CASES, ids=CASE_IDS)
def test_backward_reduce(kb, cpu_ops, shape, layout, device, why, dtype):
    kb.use(device)
    x = make(shape, layout, dtype, kb.device, loc=-0.5)
    dy = make(shape, layout, dtype, kb.device, seed=1)
    mean, invstd, _ = global_stats(kb.ops, x)
    out = kb.ops.batch_norm_backward_reduce(dy, x, mean, invstd)
    c = shape[1]
    assert out.dtype == acc_of(dtype) and out.shape == (2 * c,)
    exp = ref.batch_norm_backward_reduce(dy, x, mean, invstd)
    tol = ACC_TOL.get(dtype, 1e-5)
    # Sums of ~n terms of size ~1: scale the tolerance by sum |dy| (what the rounding errors scale with).
    scale = float(ref.batch_norm_backward_reduce(dy.abs(), x, mean, invstd)[:c].max())
    torch.testing.assert_close(out, exp, rtol=tol, atol=tol * scale)
    torch.testing.assert_close(out.cpu(), cpu_ops.batch_norm_backward_reduce(*to_cpu(dy, x, mean, invstd)),
                               rtol=2 * tol, atol=2 * tol * scale)
    if kb.device == "cuda":
        t_dy, t_dyxmu, _, _ = torch.batch_norm_backward_reduce(dy, x, mean, invstd, None, True, False, False)
        torch.testing.assert_close(out[:c], t_dy.to(out.dtype), rtol=10 * tol, atol=10 * tol * scale)
        torch.testing.assert_close(out[c:], (t_dyxmu * invstd).to(out.dtype), rtol=10 * tol, atol=10 * tol * scale)


@pytest.mark.parametrize("dtype,mode", AFFINE)
@pytest.mark.parametrize("shape,layout,device,why", CASES, ids=CASE_IDS)
def test_backward_elemt(kb, cpu_ops, inputs, shape, layout, device, why, dtype, mode):
    kb.use(device)
    x = make(shape, layout, dtype, kb.device, loc=0.25)
    dy = make(shape, layout, dtype, kb.device, seed=2, loc=0.1)

    def forward_and_reduce():
        mean, invstd, count = global_stats(kb.ops, x)
        return mean, invstd, count, kb.ops.batch_norm_backward_reduce(dy, x, mean, invstd)

    mean, invstd, count, reduced = shared(inputs, ("backward_elemt", shape, layout, device, dtype), forward_and_reduce)
    w, _ = affine(shape[1], mode, dtype, kb.device)
    dx = kb.ops.batch_norm_backward_elemt(dy, x, mean, invstd, w, reduced, count)
    assert dx.dtype == x.dtype and dx.shape == x.shape and dx.stride() == x.stride()
    rtol, atol = OUT_TOL[dtype]
    close(dx, ref.batch_norm_backward_elemt(dy, x, mean, invstd, w, reduced, count), rtol, 4 * atol)
    close(dx, cpu_ops.batch_norm_backward_elemt(*to_cpu(dy, x, mean, invstd, w, reduced, count)), 2 * rtol, 8 * atol)
    if kb.device == "cuda":
        c = shape[1]
        counts = torch.tensor([int(float(count))], dtype=torch.int32, device="cuda")
        t_dx = torch.batch_norm_backward_elemt(dy, x, mean, invstd, w, reduced[:c], reduced[c:] / invstd, counts)
        close(dx, t_dx, rtol, 4 * atol)


@pytest.mark.parametrize("poison", [float("inf"), float("nan")])
def test_backward_elemt_zero_global_count(kb, cpu_ops, poison):
    """Every rank empty: dx = 0 (as the CPU op gives), even where dy or x hold inf or NaN."""
    kb.use(H100)
    x = make((4, 3, 5), "contiguous", torch.float32, kb.device)
    x[0, 0, 0] = poison
    dy = x.clone()
    dy[1, 2, 3] = poison
    mean, invstd = torch.zeros(3, device=kb.device), torch.ones(3, device=kb.device)
    red = torch.ones(6, device=kb.device)
    zero = torch.zeros((), dtype=torch.float64, device=kb.device)
    dx = kb.ops.batch_norm_backward_elemt(dy, x, mean, invstd, None, red, zero)
    assert torch.equal(dx.cpu(), torch.zeros(4, 3, 5))
    assert torch.equal(dx.cpu(), cpu_ops.batch_norm_backward_elemt(*to_cpu(dy, x, mean, invstd, None, red, zero)))


@pytest.mark.cuda
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_training_step_makes_no_host_sync(layout):
    """Forward + backward through the ops (momentum=None included) and the module, with syncs as errors."""
    from src.syncbn import SyncBatchNorm2d

    ops = load_extension()
    x = make((8, 16, 10, 10), layout, torch.float32, "cuda", loc=2.0)
    dy = make((8, 16, 10, 10), layout, torch.float32, "cuda", seed=4)
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


@pytest.mark.cuda
def test_indexing_beyond_2_pow_31():
    """More than 2^31 elements, channels-first and channels-last: offsets must be 64-bit."""
    ops = load_extension()
    length = 2**30 + 256  # 2 channels -> 2^31 + 512 elements per tensor
    if torch.cuda.get_device_properties(0).total_memory <= 3 * 4 * 2 * length * 2:
        pytest.skip("needs ~20 GB of GPU memory")
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(1, 2, length, generator=gen, device="cuda", dtype=torch.bfloat16) + 3).to(torch.bfloat16)
    for xin in (x, x[0].t().contiguous()):  # (1, 2, L) channels-first; (L, 2) channels-last
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
