"""What the SyncBN CUDA self-check runs (src/syncbn/selfcheck.py): its cases, their inputs, the float64
reference of each op, and the tolerances.

Each case simulates a small process group inside one process: the global batch is split along N into
ranks (an empty rank included), so every op runs as SyncBatchNorm chains it: stats per rank, one gather,
elemt per rank, backward_reduce per rank, their sum (the all_reduce), backward_elemt per rank. Every op
is checked in isolation: its reference gets exactly the inputs the op got (the kernels' own upstream
outputs), so a disagreement names the op that produced it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

EPS = 1e-5
MOMENTUM = 0.1
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
OPS = ("batch_norm_stats", "batch_norm_gather_stats", "batch_norm_mean_sums", "batch_norm_deviation_sums",
       "batch_norm_reduced_stats", "batch_norm_elemt", "batch_norm_backward_reduce", "batch_norm_backward_elemt")

# Tolerances, as rtol and as atol relative to the largest |reference| of the output compared:
# - Reductions (statistics, running stats, backward sums) accumulate in fp32 (fp64 for fp64 input) over at
#   most 16k values per rank and channel in the fixed cases (~101k in the device-sized channels-last case
#   on an H200, each thread's few rows merged in a tree): chunked Welford / pairwise-like sums keep the
#   relative error near 1e-6; 1e-4 leaves room for a GPU's fused multiply-adds and another summation order (PyTorch's kernels),
#   while a wrong result (a lost tail, a wrong channel, a bad merge) is off by O(1). fp64: 1e-9.
# - Elementwise outputs (y, dx) are computed in fp32 (fp64) and rounded once to the input dtype; they may
#   differ from the float64 result by a rounding step (fp16 2^-11, bf16 2^-8 relative) and by the fp32
#   arithmetic of dx's three terms: 4 units of the dtype's last place of the largest output.
REDUCE_TOL = {torch.float64: 1e-9}
REDUCE_TOL_DEFAULT = 1e-4
ELEMENT_TOL = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 4 * 2.0**-10, torch.bfloat16: 4 * 2.0**-7}


@dataclass(frozen=True)
class Case:
    """One self-check input: global shape, layout, per-rank batch sizes along N, and what it is there for."""

    shape: tuple[int, ...]
    layout: str  # "contiguous" | "channels_last"
    ranks: tuple[int, ...]
    why: str

    @property
    def name(self) -> str:
        """Short id for messages, e.g. 5x8x4x6-contiguous-ranks3+2."""
        return f"{'x'.join(map(str, self.shape))}-{self.layout}-ranks{'+'.join(map(str, self.ranks))}"


CASES = (
    Case((5, 8, 4, 6), "contiguous", (3, 2), "NCHW, S = 24: vector loads for every width, partial unrolled chunks"),
    Case((6, 16, 3, 3), "channels_last", (4, 0, 2), "channels_last, C = 16: vectorised rows; an empty rank"),
    Case((4, 5, 3, 7), "channels_last", (2, 2), "C = 5, S = 21: scalar paths, inactive lanes, odd tails"),
    Case((2, 4, 128, 128), "contiguous", (1, 1), "one sample, large plane: the plane is split across blocks"),
)

# The kernels size each launch for R resident blocks of 256 threads (launch.cuh: SMs x the blocks per SM that
# cudaOccupancyMaxActiveBlocksPerMultiprocessor gives the very kernel launched, which counts its registers), so
# two launch branches depend on the device and on the kernels' registers:
# - channels-first, N split across blocks (channels_first_geometry: n_splits = min(ceil(R / C),
#   ceil(N / block.y)) > 1): with S = 8 a block is 8 x 32 threads for every dtype, so a rank of more than
#   32 planes and C = 4 < R splits its planes (61 and 39: a partial last split);
# - channels-last, whole unrolled 4-row chunks (stats_channels_last_kernel's `m + 3 * stride < M`, stride
#   = splits x block.y, splits = min(ceil(R / grid.x), ceil(M / block.y))): with C = 16 (one channel group,
#   block.y = 16 x the vector width: 32 / 64 / 128 rows for fp64 / fp32 / fp16 and bf16) a rank needs more
#   than 3 x block.y x R rows. On an H200, ptxas gives the stats kernels 56 (fp32) and 112 (bf16) registers
#   per thread: 4 and 2 blocks per SM, R = 528 and 264, and 3 x 64 x 528 = 3 x 128 x 264 = 101376 rows:
#   2 x 16 x 1585 x 32 (1.6M elements). Sized by thread slots instead (8 blocks per SM) it would be 4x that.
THREADS_PER_BLOCK = 256
C_UNROLL = 16  # the channels of the unrolled channels-last case: one channel group of 256 threads
VEC = {torch.float64: 2, torch.float32: 4, torch.float16: 8, torch.bfloat16: 8}  # 16-byte vectors
# kernel_occupancy() lists the stats kernel's fp32 and bf16 instantiations: fp16 has bf16's vector width and
# about its registers (ptxas on sm_90: 97 and 112, both 2 blocks of 256 per SM); fp64, whose rows per block
# are half fp32's, is taken at the thread-slot bound (which is never below its real occupancy).
OCCUPANCY_ENTRY = {torch.float32: "stats_channels_last<float,4>", torch.bfloat16: "stats_channels_last<bfloat16,8>",
                   torch.float16: "stats_channels_last<bfloat16,8>"}


def resident_blocks(sm_count: int, max_threads_per_sm: int) -> int:
    """Blocks of 256 threads that fit on a device by its thread slots alone (an upper bound of any kernel's)."""
    return max(sm_count, 1) * max(max_threads_per_sm // THREADS_PER_BLOCK, 1)


def stats_resident_blocks(table: list[dict] | None, sm_count: int, max_threads_per_sm: int) -> dict[torch.dtype, int]:
    """R of the channels-last stats kernel per dtype, from the extension's kernel_occupancy() table (SMs x its
    blocks_per_sm); the thread-slot bound where the table has no entry (fp64, or no table)."""
    by_name = {entry["kernel"]: int(entry["blocks_per_sm"]) for entry in table or []}
    bound = resident_blocks(sm_count, max_threads_per_sm)
    out = {}
    for dtype in DTYPES:
        per_sm = by_name.get(OCCUPANCY_ENTRY.get(dtype, ""))
        out[dtype] = max(sm_count, 1) * max(per_sm, 1) if per_sm is not None else bound
    return out


def unroll_rows(resident: int | dict[torch.dtype, int]) -> int:
    """Rows per rank with which a thread of block (0, 0) gets 4 full rows in every dtype (above)."""
    per_dtype = resident if isinstance(resident, dict) else dict.fromkeys(DTYPES, resident)
    return max(3 * (THREADS_PER_BLOCK * VEC[dt] // C_UNROLL) * r for dt, r in per_dtype.items()) + 1


def device_cases(resident: int | dict[torch.dtype, int]) -> tuple[Case, ...]:
    """The cases that reach the device-sized branches (above); `resident`: R per dtype (stats_resident_blocks),
    or one R for every dtype."""
    rows = unroll_rows(resident)
    h = -(-rows // (2 * 32))  # a rank is 2 x 16 x h x 32: 64 h rows
    fewest = min(resident.values()) if isinstance(resident, dict) else resident
    return (
        Case((100, 4, 2, 4), "contiguous", (61, 39), "N = 61 and 39 planes of S = 8: planes split across blocks"),
        Case((2, C_UNROLL, h, 32), "channels_last", (2,), f"{64 * h} rows of C = 16 for {fewest}+ resident blocks: "
             "whole unrolled 4-row chunks"),
    )


def cases_for(resident: int | dict[torch.dtype, int]) -> tuple[Case, ...]:
    """Every self-check case for a device: the fixed ones and the device-sized ones."""
    return CASES + device_cases(resident)


def make_case_inputs(case: Case, dtype: torch.dtype, device: torch.device | str, seed: int = 0):
    """(xs, dys, weight, bias): per-rank inputs in the case's layout on `device`, and the affine parameters
    (fp32 for fp16/bf16 input, as under autocast; the input dtype otherwise). Values come from a CPU
    generator, so every device sees the same data."""
    gen = torch.Generator().manual_seed(seed)
    c = case.shape[1]
    chan = torch.linspace(-1.0, 1.0, c, dtype=torch.float64).view([1, c] + [1] * (len(case.shape) - 2))
    x = torch.randn(case.shape, generator=gen, dtype=torch.float64) + 0.5 + chan
    dy = torch.randn(case.shape, generator=gen, dtype=torch.float64) - 0.25 * chan
    pdt = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    weight = (torch.rand(c, generator=gen, dtype=torch.float64) + 0.5).to(pdt).to(device)
    bias = torch.randn(c, generator=gen, dtype=torch.float64).to(pdt).to(device)
    fmt = torch.channels_last if case.layout == "channels_last" else torch.contiguous_format
    xs, dys, start = [], [], 0
    # Made in their final dtype and layout on the CPU, then copied (`to` keeps the strides): on the device
    # every input is written by a copy, never by a PyTorch kernel, which compute-sanitizer's initcheck, watching
    # our kernels alone, could not see writing.
    for n in case.ranks:
        xs.append(x[start:start + n].to(dtype).contiguous(memory_format=fmt).to(device))
        dys.append(dy[start:start + n].to(dtype).contiguous(memory_format=fmt).to(device))
        start += n
    return xs, dys, weight, bias


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The kernels' accumulation dtype for `dtype` input."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _flat(x: torch.Tensor) -> torch.Tensor:
    """(N, C, *) -> (C, N * prod(*)) in float64 on the CPU, whatever the layout."""
    return x.detach().double().cpu().transpose(0, 1).reshape(x.shape[1], -1)


def _bcast(v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return v.detach().double().cpu().view([1, -1] + [1] * (x.dim() - 2))


def ref_stats(x: torch.Tensor) -> torch.Tensor:
    """[count, mean(C), M2(C)] of x in float64."""
    f = _flat(x)
    n = f.shape[1]
    mean = f.mean(1) if n else torch.zeros(f.shape[0], dtype=torch.float64)
    m2 = ((f - mean[:, None]) ** 2).sum(1) if n else torch.zeros_like(mean)
    return torch.cat([torch.tensor([float(n)], dtype=torch.float64), mean, m2])


def ref_merged(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(count, mean, M2) of the gathered [count, mean, M2] rows merged (Chan), in float64 on the CPU."""
    rows = rows.detach().double().cpu()
    c = (rows.shape[1] - 1) // 2
    counts, means, m2s = rows[:, 0], rows[:, 1:1 + c], rows[:, 1 + c:]
    n = counts.sum()
    mean = (counts[:, None] * means).sum(0) / n
    return n, mean, m2s.sum(0) + (counts[:, None] * (means - mean) ** 2).sum(0)


def ref_mean_sums(stats: torch.Tensor) -> torch.Tensor:
    """[n, n * mean] of one rank's [n, mean, M2], in float64 on the CPU."""
    stats = stats.detach().double().cpu()
    c = (stats.numel() - 1) // 2
    return torch.cat([stats[:1], stats[0] * stats[1:1 + c]])


def ref_deviation_sums(stats: torch.Tensor, sums: torch.Tensor) -> torch.Tensor:
    """M2 + n (mean - S/N)^2 of one rank's [n, mean, M2], [N, S] the summed mean sums, in float64 on the CPU."""
    stats, sums = stats.detach().double().cpu(), sums.detach().double().cpu()
    c = (stats.numel() - 1) // 2
    if float(stats[0]) == 0 or float(sums[0]) == 0:
        return torch.zeros(c, dtype=torch.float64)
    return stats[1 + c:] + stats[0] * (stats[1:1 + c] - sums[1:] / sums[0]) ** 2


def ref_gather(rows: torch.Tensor, running_mean: torch.Tensor, running_var: torch.Tensor):
    """(mean, invstd, count, new running_mean, new running_var) of the gathered rows, in float64."""
    n, mean, m2 = ref_merged(rows)
    invstd = torch.rsqrt(m2 / n + EPS)
    rm = running_mean.double().cpu() * (1 - MOMENTUM) + MOMENTUM * mean
    rv = running_var.double().cpu() * (1 - MOMENTUM) + MOMENTUM * m2 / (n - 1)
    return mean, invstd, n, rm, rv


def ref_elemt(x, weight, bias, mean, invstd) -> torch.Tensor:
    """(x - mean) * invstd * weight + bias in float64."""
    return ((x.detach().double().cpu() - _bcast(mean, x)) * _bcast(invstd, x) * _bcast(weight, x)
            + _bcast(bias, x))


def ref_backward_reduce(dy, x, mean, invstd) -> torch.Tensor:
    """[sum(dy), sum(dy * xhat)] per channel in float64."""
    xhat = (x.detach().double().cpu() - _bcast(mean, x)) * _bcast(invstd, x)
    return torch.cat([_flat(dy).sum(1), _flat(dy.double().cpu() * xhat).sum(1)])


def ref_backward_elemt(dy, x, mean, invstd, weight, reduced, count) -> torch.Tensor:
    """weight * invstd * (dy - sum_dy / n - xhat * sum_dy_xhat / n) in float64."""
    c, n = x.shape[1], float(count)
    red = reduced.detach().double().cpu()
    xhat = (x.detach().double().cpu() - _bcast(mean, x)) * _bcast(invstd, x)
    return (_bcast(weight, x) * _bcast(invstd, x)
            * (dy.detach().double().cpu() - _bcast(red[:c], x) / n - xhat * _bcast(red[c:], x) / n))


def compare(actual: torch.Tensor, expected: torch.Tensor, tol: float) -> tuple[float, float, int] | None:
    """None when |actual - expected| <= tol * (|expected| + max |expected|) everywhere (NaN never passes);
    else (max abs difference, allowed there, flat index of the worst element)."""
    a, e = actual.detach().double().cpu().reshape(-1), expected.detach().double().cpu().reshape(-1)
    if a.shape != e.shape:
        return float("inf"), 0.0, -1
    if a.numel() == 0:
        return None
    scale = float(e.abs().max())
    allowed = tol * (e.abs() + scale)
    diff = (a - e).abs()
    bad = ~(diff <= allowed)  # NaN compares false: it fails
    if not bool(bad.any()):
        return None
    excess = torch.where(bad, diff.nan_to_num(float("inf")) - allowed, torch.full_like(diff, -1.0))
    i = int(excess.argmax())
    return float(diff[i]), float(allowed[i]), i
