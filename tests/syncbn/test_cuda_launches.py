"""The CUDA kernel tests' cases reach the launch branches they are there for (cuda_cases.CASES).

The emulated build logs every launch (kernel name with its template arguments, grid, block), from which
each branch of the kernels is visible: the vector width (VEC, the last template argument), a channel
split across blocks (a finalize kernel follows), a plane split across blocks (more y-blocks than the
planes need), a second pass over planes or rows (fewer threads than planes or rows / 4), several
channel groups per row (grid.x > 1 channels-last). If a change to the launch geometry makes a case miss
its branch, this fails, and the case needs another shape or emulated device.
"""
from __future__ import annotations

import math
import re

import pytest
import torch

from src.syncbn.extension import load_emulated_cuda_extension
from tests.syncbn.cuda_cases import CASES, DTYPES, H100, SCHEDULES, make, one_intraop_thread

pytestmark = pytest.mark.cuda_emulated

STREAMING = ("stats", "elemt", "backward_reduce", "backward_elemt")


@pytest.fixture(scope="module", params=SCHEDULES)
def emu(request):
    """The emulated kernels, under each schedule (lane, warp and block order) in turn; torch on one thread."""
    module = load_emulated_cuda_extension(H100)
    module.set_schedule(request.param)
    with one_intraop_thread():
        yield module
    module.set_schedule(None)
    module.set_device(H100)
    module.record_launches(False)


def case(prefix: tuple, layout: str) -> tuple:
    """The CASES entry with this shape and layout."""
    for shape, lay, device, why in CASES:
        if shape == prefix and lay == layout:
            return shape, lay, device
    raise KeyError((prefix, layout))


def run_ops(emu, shape, layout, device, dtype) -> dict[str, list[dict]]:
    """Launches of each op's streaming kernels (and their finalize kernels) for one case."""
    emu.set_device(device)
    x = make(shape, layout, dtype, "cpu", loc=0.5)
    dy = make(shape, layout, dtype, "cpu", seed=1)
    emu.record_launches(True)
    out = {}
    stats = emu.batch_norm_stats(x)
    out["stats"] = emu.launches()
    mean, invstd, count = emu.batch_norm_gather_stats(stats.view(1, -1), None, None, None, 0.1, 1e-5,
                                                      dtype == torch.float64)
    emu.launches()
    emu.batch_norm_elemt(x, None, None, mean, invstd)
    out["elemt"] = emu.launches()
    red = emu.batch_norm_backward_reduce(dy, x, mean, invstd)
    out["backward_reduce"] = emu.launches()
    emu.batch_norm_backward_elemt(dy, x, mean, invstd, None, red, count)
    out["backward_elemt"] = emu.launches()
    emu.record_launches(False)
    return out


def main(launches: list[dict], layout_kind: str) -> dict:
    """The op's streaming launch (channels_first or channels_last kernel)."""
    (rec,) = [r for r in launches if f"channels_{layout_kind}_kernel" in r["kernel"]]
    return rec


def vec_of(rec: dict) -> int:
    return int(re.search(r"(\d+)>$", rec["kernel"]).group(1))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_plane_split_across_blocks(emu, dtype):
    """Small batch, large planes: each plane is split between several blocks (s_splits > 1), and the
    per-block partials of the reductions are merged by the finalize kernels."""
    shape, layout, device = case((2, 4, 128, 128), "contiguous")
    runs = run_ops(emu, shape, layout, device, dtype)
    for op in STREAMING:
        rec = main(runs[op], "first")
        n_blocks_for_planes = math.ceil(shape[0] / rec["block"][1])
        assert rec["grid"][1] > n_blocks_for_planes, (op, rec)
        assert vec_of(rec) == 16 // torch.empty((), dtype=dtype).element_size()
    assert any("stats_finalize" in r["kernel"] for r in runs["stats"])
    assert any("backward_reduce_finalize" in r["kernel"] for r in runs["backward_reduce"])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_second_pass_over_planes(emu, dtype):
    """More planes than a channel's threads cover in one step: every thread loops over several planes."""
    shape, layout, device = case((1024, 8, 3, 3), "contiguous")
    for op, launches in run_ops(emu, shape, layout, device, dtype).items():
        rec = main(launches, "first")
        assert rec["grid"][1] * rec["block"][1] < shape[0], (op, rec)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_several_channel_groups_per_row(emu, dtype):
    """C = 264 channels-last: more vectors per row than 32 threads, so grid.x > 1 channel groups."""
    shape, layout, device = case((4, 264, 3, 3), "channels_last")
    for op, launches in run_ops(emu, shape, layout, device, dtype).items():
        rec = main(launches, "last")
        assert rec["grid"][0] > 1 and vec_of(rec) > 1, (op, rec)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_full_four_row_chunks_channels_last(emu, dtype):
    """Few blocks for many rows: a thread's rows m, m + stride, ... fill whole unrolled 4-row chunks."""
    shape, layout, device = case((96, 16, 8, 8), "channels_last")
    rows = shape[0] * shape[2] * shape[3]
    for op, launches in run_ops(emu, shape, layout, device, dtype).items():
        rec = main(launches, "last")
        stride = rec["grid"][1] * rec["block"][1]
        assert 3 * stride < rows and vec_of(rec) > 1, (op, rec)


def test_full_unroll_channels_first(emu):
    """sv = 32 vectors per plane and 8 threads per row: the unrolled 4-vector chunks are full."""
    shape, layout, device = case((32, 4, 8, 16), "contiguous")
    for op, launches in run_ops(emu, shape, layout, device, torch.float32).items():
        rec = main(launches, "first")
        sv = shape[2] * shape[3] // vec_of(rec)
        assert rec["block"][0] * 3 < sv, (op, rec)


@pytest.mark.parametrize("shape,layout,vec", [((4, 8, 5, 7), "contiguous", 1), ((8, 16, 8, 8), "misaligned", 1),
                                              ((6, 5, 3, 7), "channels_last", 1), ((8, 16, 8, 8), "contiguous", 4),
                                              ((8, 16, 8, 8), "channels_last", 4)])
def test_scalar_and_vector_paths(emu, shape, layout, vec):
    """Shapes whose inner extent no vector width divides (or misaligned data) take the scalar path."""
    shape, layout, device = case(shape, layout)
    kind = "first" if layout != "channels_last" else "last"
    for op, launches in run_ops(emu, shape, layout, device, torch.float32).items():
        assert vec_of(main(launches, kind)) == vec, op


@pytest.mark.parametrize("shape,layout", [((16, 16, 8, 8), "channels_last"), ((256, 2, 8, 8), "contiguous")])
def test_grid_follows_the_kernels_occupancy(shape, layout):
    """A kernel whose registers leave room for 2 resident blocks per SM (112 per thread, as ptxas gives
    the bf16 channels-last stats kernel on sm_90) gets a grid of SMs x 2 blocks, not the SMs x 8 that
    the SM's thread slots alone allow; a kernel without the limit keeps SMs x 8."""
    kind = "last" if layout == "channels_last" else "first"
    sms = 2
    device = f"h100,sm_count={sms}"
    limited = f"{device},registers.stats_channels_{kind}_kernel=112"
    module = load_emulated_cuda_extension(H100)
    assert module.parse_device(limited)["kernel_registers"] == {f"stats_channels_{kind}_kernel": 112}
    try:
        with one_intraop_thread():
            free = run_ops(module, shape, layout, device, torch.float32)
            bound = run_ops(module, shape, layout, limited, torch.float32)
    finally:
        module.set_device(H100)

    def blocks(launches: list[dict]) -> int:
        grid = main(launches, kind)["grid"]
        return grid[0] * grid[1] * grid[2]

    assert blocks(free["stats"]) == sms * 8
    assert blocks(bound["stats"]) == sms * 2
    assert blocks(free["backward_reduce"]) == blocks(bound["backward_reduce"]) == sms * 8
