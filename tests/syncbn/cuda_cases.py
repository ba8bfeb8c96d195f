"""Shapes, devices, data and tolerances for the CUDA kernel tests (test_cuda_kernels.py).

The kernels run on two backends: the emulated build (the CUDA sources compiled for the CPU against the
SIMT emulation in csrc/simt/, CPU tensors; every `make test`) and a real GPU (tests marked `cuda`).
Each case names the emulated device it runs on, chosen so that the launch branch it is there for is
reached at a size the CPU can afford (a 16-SM Orin, or one of its SMs, needs far fewer values than an
H100 to split a plane across blocks or to give a thread several rows); on a GPU the case runs on
whatever the GPU is.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import torch

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
EPS = 1e-5
# Tolerances. The reference sees the very same (already rounded) input values in float64, so what is
# left is the kernels' arithmetic: statistics and reductions accumulate in fp32 (fp64 for fp64 input)
# over <= ~1e5 values per channel -> relative error a few 1e-6 (fp64: ~1e-15); we allow 1e-5 of the
# data's scale (fp64: 1e-10). Elementwise outputs are computed in fp32 and rounded once to the input
# dtype, so they may differ from the rounded float64 result by one rounding step: 2 ulps of the dtype.
ACC_TOL = {torch.float64: 1e-10}  # default 1e-5: fp32 accumulation
OUT_TOL = {torch.float64: (1e-10, 1e-10), torch.float32: (1e-5, 1e-5), torch.float16: (2.0**-9, 2.0**-10),
           torch.bfloat16: (2.0**-6, 2.0**-7)}

H100 = "h100"
ORIN = "orin"              # 16 SMs x 1536 threads: 96 resident 256-thread blocks
ORIN1 = "orin,sm_count=1"  # one of its SMs, 6 resident blocks: few splits, so threads loop over many rows

# (shape, layout, emulated device, what the case is for).
CASES = [
    ((4, 8, 5, 7), "contiguous", H100, "S = 35: no vector width divides it -> scalar channels-first"),
    ((8, 16, 8, 8), "contiguous", H100, "vectorised channels-first, partial unroll"),
    ((8, 16, 8, 8), "channels_last", H100, "vectorised channels-last"),
    ((6, 5, 3, 7), "channels_last", H100, "C = 5: scalar channels-last, inactive lanes in the reduction"),
    ((2, 6, 4, 3, 5), "channels_last", H100, "channels_last_3d"),
    ((2, 6, 4, 3, 5), "contiguous", H100, "5-D channels-first"),
    ((37, 24), "contiguous", H100, "plain (N, C): channels-last walk"),
    ((16, 3, 1, 1), "contiguous", H100, "S == 1: contiguous and channels_last at once"),
    ((1, 12, 6, 4), "contiguous", H100, "one sample: the threads go along the plane"),
    ((3, 5, 2, 12), "contiguous", H100, "S = 24: a tail after full vectors for every width (2, 4, 8)"),
    ((5, 3, 4, 3), "channels_last", ORIN, "C = 3, S = 12"),
    ((8, 16, 8, 8), "misaligned", H100, "data not 16-byte aligned: scalar path"),
    ((32, 4, 8, 16), "contiguous", H100, "sv = 32 vectors, bx = 8: full unrolled chunks"),
    ((16, 32, 28, 28), "contiguous", H100, "several blocks per channel: partials + finalize kernel"),
    ((64, 48, 10, 10), "channels_last", H100, "many row splits per channel group: partials + finalize"),
    ((1024, 8, 3, 3), "contiguous", ORIN, "more planes than the blocks' threads: a second loop over planes"),
    ((2, 4, 128, 128), "contiguous", ORIN, "small batch, large plane: planes split across blocks"),
    ((4, 264, 3, 3), "channels_last", H100, "C = 264: several channel groups per row for every width"),
    ((96, 16, 8, 8), "channels_last", ORIN1, "6144 rows on 6 (12 elementwise) blocks: full 4-row chunks"),
]
CASE_IDS = [f"{'x'.join(map(str, s))}-{lay}-{dev.replace(',sm_count=', '-sm')}" for s, lay, dev, _ in CASES]


@dataclass
class Backend:
    """Where the CUDA kernels run: `ops` is the module, tensors live on `device`; `schedule` is the
    emulated launches' lane, warp and block order (csrc/simt/schedule.h), None on a GPU."""

    name: str
    ops: Any
    device: str
    schedule: str | None = None

    def use(self, emulated_device: str) -> None:
        """Emulate `emulated_device` for the next launches (a GPU is what it is)."""
        if self.schedule is not None:
            self.ops.set_device(emulated_device)

    def release(self) -> None:
        """Back to the emulated module's defaults (H100, schedule from the environment) for other tests."""
        if self.schedule is not None:
            self.ops.set_device(H100)
            self.ops.set_schedule(None)


# Every emulated case runs under two schedules: lanes, warps and blocks in index order, then in reverse
# order. A kernel that is right only because the emulator happened to run a writer before its reader
# (a missing barrier, a reduction that assumes the last warp runs last) fails under one of them, and
# the emulator's race detector reports the unsynchronised accesses under both.
# No case can skip the reverse run, not even one launching a single warp in a single block: the reverse
# schedule reverses the lanes within each warp too (LaunchOrder::block_threads, csrc/simt/schedule.cpp),
# so any launch of more than one thread runs in another order (test_simt.py's syncwarp race probe is one
# 32-thread warp whose result the order changes). Only a launch of one thread, or no launch at all,
# runs the same either way; every launch the ops make on CASES has at least 128 threads.
SCHEDULES = ("forward", "reverse")
BACKENDS = [*(pytest.param(f"emulated-{s}", marks=pytest.mark.cuda_emulated) for s in SCHEDULES),
            pytest.param("cuda", marks=pytest.mark.cuda)]


def load_backend(name: str) -> Backend:
    """The kernels of backend `name` ("emulated-<schedule>", "emulated" = forward, or "cuda")."""
    from src.syncbn.extension import load_emulated_cuda_extension, load_extension

    if name == "emulated" or name.startswith("emulated-"):
        schedule = name.removeprefix("emulated").removeprefix("-") or "forward"
        ops = load_emulated_cuda_extension(H100)
        ops.set_schedule(schedule)
        return Backend(name, ops, "cpu", schedule)
    return Backend(name, load_extension(), "cuda")


@contextmanager
def one_intraop_thread() -> Iterator[None]:
    """torch's CPU ops on one thread while the kernel tests run (the previous count restored after).

    Their tensors hold at most ~400k values, where OpenMP's fork and join cost more than a second thread
    saves, and on a machine whose cores are shared (CI's two, pytest-xdist workers, a GPU box's other
    jobs) the waiting threads spin: a subset of test_cuda_kernels.py took 220 s with torch's default two
    threads on the busy 2-core CI machine and 39 s with one. What runs on more threads here is only the
    references (float64 ops, our CPU kernels, whose own multi-threaded paths test_kernels.py tests); the
    emulated kernels run on one thread either way.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def make(shape, layout, dtype, device, *, seed=0, loc=0.0, scale=1.0) -> torch.Tensor:
    """loc + scale * N(0, 1) + a per-channel offset (catches channel mix-ups), in the requested layout.

    The values come from a CPU generator, so both backends see the same data.
    """
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(shape, generator=gen, dtype=torch.float64)
    chan = torch.linspace(-1.0, 1.0, shape[1], dtype=torch.float64).view([1, -1] + [1] * (len(shape) - 2))
    vals = (base * scale + loc + chan * scale).to(dtype).to(device)
    if layout == "channels_last":
        return vals.contiguous(memory_format=torch.channels_last if len(shape) == 4 else torch.channels_last_3d)
    if layout == "misaligned":
        flat = torch.empty(vals.numel() + 1, device=device, dtype=dtype)
        flat[1:] = vals.flatten()
        return flat[1:].view(shape)
    return vals


def acc_of(dtype: torch.dtype) -> torch.dtype:
    """The accumulation dtype the kernels use for `dtype` input."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def close(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol_rel: float, msg: str = "") -> None:
    """assert_close in float64 on the CPU, with atol scaled to the largest |expected| (relative tolerances)."""
    actual, expected = actual.detach().cpu().double(), expected.detach().cpu().double()
    scale = max(float(expected.abs().max()) if expected.numel() else 0.0, 1e-30)
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol_rel * scale, msg=msg or None)


def affine(c: int, mode: str, dtype: torch.dtype, device: str):
    """weight, bias: None, in the input dtype ('native'), or fp32 with a low-precision input ('fp32')."""
    if mode == "none":
        return None, None
    pdt = dtype if mode == "native" else torch.float32
    gen = torch.Generator().manual_seed(7)
    w = (torch.rand(c, generator=gen) + 0.5).to(pdt).to(device)
    b = torch.randn(c, generator=gen).to(pdt).to(device)
    return w, b


def to_cpu(*tensors):
    """The same tensors on the CPU (None stays None), for our CPU kernels."""
    return [t.cpu() if isinstance(t, torch.Tensor) else t for t in tensors]
