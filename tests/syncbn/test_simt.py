"""The SIMT emulation itself (csrc/simt/), through its probe kernels (csrc/simt/probes.cu).

Each test states the CUDA behaviour it expects (from the CUDA C++ Programming Guide and the PTX ISA),
computed here independently of how the emulator implements it, and would fail if the mechanism were
wrong: a barrier that does not wait lets thread 0 read its neighbour's slot before it is written; a
shuffle with the wrong lane arithmetic returns another lane's value; a missing check lets a faulty
kernel pass. The probes run on both context-switch backends (the asm switch and ucontext).
"""
from __future__ import annotations

import re

import pytest
import torch

from src.syncbn.extension import load_emulated_cuda_extension

pytestmark = pytest.mark.cuda_emulated

FULL = 0xFFFFFFFF
# The bytes the emulator fills fresh device memory with: 0xFF..., i.e. -1 as int64.
POISON = -1


@pytest.fixture(scope="module")
def emu():
    """The emulated module on an H100-sized device (restored after every test that changes it)."""
    return load_emulated_cuda_extension("h100")


@pytest.fixture(params=["asm", "ucontext"])
def fibers(emu, request):
    """Run the test once per context-switch backend."""
    if request.param == "asm" and not emu.asm_fibers_available():
        pytest.skip("the asm fiber switch exists only on x86-64 Linux")
    before = emu.fibers()
    emu.set_fibers(request.param)
    yield request.param
    emu.set_fibers(before)


@pytest.mark.parametrize("grid,block", [((3, 2, 2), (5, 3, 2)), ((1, 1, 1), (1024, 1, 1)), ((70000, 1, 1), (1, 1, 1))],
                         ids=["3d", "1024_threads", "many_blocks"])
def test_builtin_indices(emu, fibers, grid, block):
    """threadIdx/blockIdx/blockDim/gridDim of every thread, x fastest, as CUDA numbers them."""
    nb, nt = grid[0] * grid[1] * grid[2], block[0] * block[1] * block[2]
    out = torch.full((nb * nt, 12), -7, dtype=torch.int64)
    emu.probes.indices(out, list(grid), list(block))
    b = torch.arange(nb)
    t = torch.arange(nt)
    bidx = torch.stack([b % grid[0], b // grid[0] % grid[1], b // (grid[0] * grid[1])], 1)
    tidx = torch.stack([t % block[0], t // block[0] % block[1], t // (block[0] * block[1])], 1)
    expected = torch.cat([tidx.repeat(nb, 1), bidx.repeat_interleave(nt, 0),
                          torch.tensor(block).expand(nb * nt, 3), torch.tensor(grid).expand(nb * nt, 3)], 1)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("threads", [32, 96, 256, 1024])
def test_syncthreads_is_a_barrier(emu, fibers, threads):
    """Every round, each thread reads what its left neighbour stored in shared memory in that round.

    Without a barrier after the store, thread 0 (the first to run) would read the slot of thread n-1
    before n-1 stored it; without the one before the next round, a slot would be overwritten early.
    The seed changes per call, so values left in shared memory by an earlier launch never match.
    """
    blocks, rounds = 3, 4
    for seed in (11, 12):
        out = torch.empty(blocks, threads, rounds, dtype=torch.int64)
        emu.probes.barrier(out, rounds, seed)
        r = torch.arange(rounds).view(1, 1, -1)
        left = (torch.arange(threads) - 1) % threads
        expected = seed * (r + 1) + 1000 * torch.arange(blocks).view(-1, 1, 1) + left.view(1, -1, 1)
        assert torch.equal(out, expected)


def _segment(lane: int, width: int) -> tuple[int, int]:
    start = lane // width * width
    return start, start + width


def expected_shuffle(values: list, mode: str, arg: int, width: int) -> list:
    """The CUDA Programming Guide's description of each shuffle, per lane of full-mask warps."""
    out = []
    for lane, v in enumerate(values):
        w = lane % 32
        base = lane - w
        start, end = _segment(w, width)
        if mode == "idx":  # srcLane % width within the lane's segment
            src = start + arg % width
        elif mode == "up":  # lane - delta, unless that leaves the segment (then unchanged)
            src = w - arg if w - arg >= start else w
        elif mode == "down":
            src = w + arg if w + arg < end else w
        else:  # xor: lane ^ laneMask; lanes of later segments are out of reach (own value)
            src = w ^ (arg % 32)
            src = src if src < end else w
        out.append(values[base + src])
    return out


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.int32], ids=str)
@pytest.mark.parametrize("mode,arg", [("idx", 5), ("idx", 37), ("up", 1), ("up", 3), ("down", 2), ("down", 7),
                                      ("xor", 1), ("xor", 16), ("xor", 6), ("xor", 32)])
@pytest.mark.parametrize("width", [32, 16, 8, 4, 2, 1])
def test_shuffles_follow_the_programming_guide(emu, mode, arg, width, dtype):
    threads = 64  # two warps: lanes and warps are kept apart
    values = (torch.arange(threads) * 3 + 100).to(dtype)
    out = torch.zeros_like(values)
    emu.probes.shuffle(values, out, mode, arg, width, torch.full((threads,), FULL, dtype=torch.int64))
    assert out.tolist() == expected_shuffle(values.tolist(), mode, arg, width)


def test_independent_half_warp_masks(emu, fibers):
    """Lanes 0-15 and 16-31 shuffle among themselves at the same time (masks 0x0000ffff / 0xffff0000)."""
    values = torch.arange(32, dtype=torch.float64) + 0.5
    masks = torch.tensor([0x0000FFFF] * 16 + [0xFFFF0000] * 16, dtype=torch.int64)
    out = torch.zeros_like(values)
    emu.probes.shuffle(values, out, "xor", 1, 32, masks)
    assert out.tolist() == [values[i ^ 1].item() for i in range(32)]
    # A subset of lanes in a partial mask: lanes 0, 2, 4, 6 exchange with xor 2 (0<->2, 4<->6).
    masks = torch.tensor([0x55 if i in (0, 2, 4, 6) else 0 for i in range(32)], dtype=torch.int64)
    out = torch.zeros_like(values)
    emu.probes.shuffle(values, out, "xor", 2, 32, masks)
    assert out[[0, 2, 4, 6]].tolist() == [2.5, 0.5, 6.5, 4.5]


def test_partial_last_warp(emu):
    """A 48-thread block has a 16-lane second warp: a 0x0000ffff mask there is complete."""
    values = torch.arange(48, dtype=torch.float32)
    masks = torch.tensor([FULL] * 32 + [0xFFFF] * 16, dtype=torch.int64)
    out = torch.zeros_like(values)
    emu.probes.shuffle(values, out, "down", 1, 16, masks)
    assert out.tolist() == expected_shuffle(values.tolist(), "down", 1, 16)


def test_atomic_add_counts_every_thread(emu, fibers):
    count, total = torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.float64)
    emu.probes.atomic_add(count, total, 7, 96)
    assert count.item() == 7 * 96 and total.item() == 7 * 96 * 0.5


def test_dynamic_shared_memory_is_per_block_and_uninitialised(emu, fibers):
    blocks, threads = 3, 64
    out = torch.zeros(blocks, threads, 2, dtype=torch.int64)
    emu.probes.dynamic_shared(out, threads * 8, -1)
    assert (out[..., 0] == POISON).all()  # each block starts with fresh (poisoned) shared memory
    right = (torch.arange(threads) + 1) % threads
    assert torch.equal(out[..., 1], 1000 * torch.arange(blocks).view(-1, 1) + right.view(1, -1))


def test_dynamic_shared_memory_is_bounds_checked(emu):
    out = torch.zeros(1, 32, 2, dtype=torch.int64)
    emu.probes.dynamic_shared(out, 32 * 8, 31)  # the last slot: fine
    with pytest.raises(RuntimeError, match=r"dynamic_shared_kernel block \(0, 0, 0\) thread \(0, 0, 0\).*"
                                           r"out-of-bounds access: 8 bytes at byte offset 256"):
        emu.probes.dynamic_shared(out, 32 * 8, 32)


def test_fresh_device_memory_is_poisoned(emu):
    """at::empty inside an op is filled with 0xFF bytes: what no kernel wrote reads as -1 / NaN."""
    out = emu.probes.half_written(64)
    assert out[:32].tolist() == list(range(32)) and (out[32:] == POISON).all()
    assert emu.live_allocations() == 1  # the output, allocated inside the op, is device memory
    del out
    assert emu.live_allocations() == 0  # freed storages leave the registry


@pytest.mark.parametrize("grid,block,shmem,reason", [
    ((1, 1, 1), (1025, 1, 1), 0, r"blockDim.x = 1025, the device allows 1..1024"),
    ((1, 1, 1), (32, 32, 2), 0, r"block \(32, 32, 2\) has 2048 threads, the device allows 1024"),
    ((1, 1, 1), (1, 1, 65), 0, r"blockDim.z = 65, the device allows 1..64"),
    ((1, 65536, 1), (1, 1, 1), 0, r"gridDim.y = 65536, the device allows 1..65535"),
    ((1, 1, 65536), (1, 1, 1), 0, r"gridDim.z = 65536"),
    ((0, 1, 1), (32, 1, 1), 0, r"gridDim.x = 0"),
    ((1, 1, 1), (0, 1, 1), 0, r"blockDim.x = 0"),
    ((1, 1, 1), (32, 1, 1), 48 * 1024 + 1, r"49153 bytes of dynamic shared memory, the kernel may use 49152"),
])
def test_launch_limits_refuse_like_the_device(emu, grid, block, shmem, reason):
    code, detail, ran = emu.probes.launch(list(grid), list(block), shmem, 0)
    assert code in (1, 9) and not ran  # cudaErrorInvalidValue / cudaErrorInvalidConfiguration
    assert re.search(reason, detail), detail


@pytest.mark.parametrize("grid,block", [((1, 65535, 1), (1, 1, 1)), ((2, 1, 1), (1024, 1, 1)), ((1, 1, 1), (1, 1, 64)),
                                        ((1, 1, 1), (8, 8, 16))])
def test_launches_at_the_limits_run(emu, grid, block):
    code, detail, ran = emu.probes.launch(list(grid), list(block), 48 * 1024, 0)
    assert code == 0 and ran, detail


def test_dynamic_shared_memory_opt_in(emu):
    assert emu.probes.launch([1, 1, 1], [32, 1, 1], 100 * 1024, 100 * 1024)[0] == 0
    code, detail, _ = emu.probes.launch([1, 1, 1], [32, 1, 1], 0, 228 * 1024)  # H100 opt-in limit: 227 KiB
    assert code == 1 and "up to 232448 bytes" in detail
    try:
        emu.set_device("a100")
        code, detail, _ = emu.probes.launch([1, 1, 1], [32, 1, 1], 0, 200 * 1024)
        assert code == 1 and "up to 166912 bytes" in detail
    finally:
        emu.set_device("h100")


def test_refused_launch_raises_through_the_launch_check(emu):
    """C10_CUDA_KERNEL_LAUNCH_CHECK turns a refused configuration into an error naming the limit."""
    try:
        emu.set_device("h100,max_threads_per_block=128")
        with pytest.raises(RuntimeError, match=r"CUDA error: invalid configuration argument.*indices_kernel.*"
                                               r"256 threads, the device allows 128"):
            emu.probes.indices(torch.zeros(256, 12, dtype=torch.int64), [1, 1, 1], [256, 1, 1])
    finally:
        emu.set_device("h100")


FAULTS = {
    "out_of_bounds_read": r"read_kernel block \(0, 0, 0\) thread \(0, 0, 0\): out-of-bounds access: 4 bytes at byte "
                          r"offset 32 of memory allocated inside probes.fault \(32 bytes\)",
    "out_of_bounds_write": r"write_kernel block \(0, 0, 0\) thread \(0, 0, 0\): out-of-bounds access: 4 bytes at byte "
                           r"offset -4",
    "misaligned_vector_load": r"vector_read_kernel .*misaligned access: 16 bytes at byte offset 4 .*not a multiple of 16",
    "null_pointer": r"read_kernel .*access of 4 bytes through a null pointer",
    "host_pointer": r"points into no device allocation",
    "divergent_barrier": r"divergent __syncthreads\(\): this thread is at probes.cu:\d+, 16 other\(s\) wait at probes.cu:\d+",
    "barrier_after_return": r"__syncthreads\(\) \(probes.cu:\d+\) after 1 thread\(s\) of its block returned",
    "shuffle_without_own_lane": r"mask 0xfffffffe, which does not include the calling lane 0",
    "shuffle_with_returned_lane": r"thread \(7, 0, 0\): returned while lanes 0x7f of its warp wait for it",
    "shuffle_mask_disagreement": r"with mask 0xffff0000 while lanes 0xffff wait with mask 0xffffffff .*disagree on the mask",
    "shuffle_width": r"with width 3: it must be a power of 2",
    "shuffle_missing_lanes": r"mask 0xffffffff names lanes 0xffff0000 that do not exist \(warp 1 of a 48-thread block",
    "shuffle_source_outside_mask": r"thread \(15, 0, 0\): .*reads lane 31, which is not in its mask 0xffff",
    "deadlock": r"deadlock: no thread of the block can proceed. 1 of 32 live thread\(s\) wait at __syncthreads\(\) "
                r"\(probes.cu:\d+\). Warp 0: lanes 0x7fffffff wait at probes.cu:\d+ \(mask 0xffffffff\) for lanes "
                r"0x80000000, which wait at __syncthreads\(\)",
}


def test_every_fault_probe_is_tested(emu):
    assert sorted(emu.probes.fault_kinds()) == sorted(FAULTS)


@pytest.mark.parametrize("kind", sorted(FAULTS))
def test_faults_are_reported_with_kernel_block_and_thread(emu, fibers, kind):
    with pytest.raises(RuntimeError, match=FAULTS[kind]):
        emu.probes.fault(kind)
    # The emulator recovers: the next launch runs normally.
    out = torch.empty(1, 32, 2, dtype=torch.int64)
    emu.probes.barrier(out, 2, 5)
    assert out[0, 0, 0].item() == 5 + 31


def test_device_presets_and_overrides(emu):
    assert emu.parse_device("h200")["sm_count"] == 132
    assert emu.parse_device("a100")["sm_count"] == 108
    orin = emu.parse_device("orin")
    assert (orin["sm_count"], orin["max_threads_per_sm"]) == (16, 1536)
    custom = emu.parse_device("orin,sm_count=2,max_threads_per_sm=512,max_threads_per_block=512")
    assert (custom["sm_count"], custom["max_threads_per_sm"], custom["cc_minor"]) == (2, 512, 7)
    assert emu.parse_device("sm_count=4")["max_threads_per_sm"] == 2048  # on top of h100
    for bad, why in [("v100", "preset 'v100' is unknown"), ("h100,sm=3", "unknown property 'sm'"),
                     ("h100,sm_count=x", "sm_count must be an integer"), ("h100,sm_count=0", "out of range"),
                     ("h100,warp_size=64", "warp_size must be 32"),
                     ("h100,max_threads_per_sm=512", r"max_threads_per_block \(1024\) exceeds max_threads_per_sm \(512\)")]:
        with pytest.raises(RuntimeError, match=why):
            emu.parse_device(bad)


def test_device_properties_drive_the_kernels_launch_geometry(emu):
    """resident_blocks() reads cudaDeviceGetAttribute: fewer SMs give fewer blocks per channel."""
    x = torch.randn(1024, 4, 2, 2)
    blocks = {}
    try:
        for device in ("h100", "orin", "orin,sm_count=1"):
            emu.set_device(device)
            emu.record_launches(True)
            emu.batch_norm_stats(x)
            blocks[device] = emu.launches()[0]["grid"][1]
    finally:
        emu.record_launches(False)
        emu.set_device("h100")
    # About SMs x (threads per SM / 256) blocks, split over C = 4 channels: 1056 / 4 = 264 on an H100,
    # 96 / 4 = 24 on an Orin, 6 / 4 -> 2 on one Orin SM; capped at N / 32 = 32 (32 planes per 8 x 32 block).
    assert blocks == {"h100": 32, "orin": 24, "orin,sm_count=1": 2}


# --- schedules and the race detector -------------------------------------------------------------------

SCHEDULES = ["forward", "reverse", "random:1", "random:2"]


@pytest.fixture(params=SCHEDULES)
def schedule(emu, request):
    """Run the test once per schedule (lane, warp and block order; csrc/simt/schedule.h)."""
    emu.set_schedule(request.param)
    yield request.param
    emu.set_schedule(None)


@pytest.fixture
def detector(emu):
    """The race detector's switch, back on after the test."""
    yield emu
    emu.set_race_detection(True)


def run_order(emu, blocks: int, threads: int) -> list[int]:
    """The thread linear indices (block-major, x fastest) in the order the emulator ran them."""
    out = torch.full((blocks * threads,), -1, dtype=torch.int64)
    emu.probes.order(out, blocks, threads)
    return sorted(range(blocks * threads), key=lambda t: int(out[t]))


def test_schedules_order_lanes_warps_and_blocks(emu):
    """A thread that never waits runs to its end before the next starts: its ticket is its place in the order."""
    blocks, threads = 3, 80  # partial last warp
    try:
        emu.set_schedule("forward")
        assert run_order(emu, blocks, threads) == list(range(blocks * threads))
        emu.set_schedule("reverse")
        assert run_order(emu, blocks, threads) == list(reversed(range(blocks * threads)))
        emu.set_schedule("random:5")
        first = run_order(emu, blocks, threads)
        assert run_order(emu, blocks, threads) == first  # the same launch always runs in the same order
        assert sorted(first) == list(range(blocks * threads)) and first != list(range(blocks * threads))
        by_block = [t // threads for t in first]
        assert by_block == sorted(by_block, key=by_block.index)  # blocks still run one after another
        emu.set_schedule("random:6")
        assert run_order(emu, blocks, threads) != first
    finally:
        emu.set_schedule(None)


def test_schedule_from_the_environment(emu, monkeypatch):
    """SYNCTRAIN_SIMT_SCHEDULE is read at every launch unless set_schedule chose one."""
    emu.set_schedule(None)
    monkeypatch.setenv("SYNCTRAIN_SIMT_SCHEDULE", "reverse")
    assert emu.schedule() == "reverse"
    assert run_order(emu, 1, 4) == [3, 2, 1, 0]
    monkeypatch.setenv("SYNCTRAIN_SIMT_SCHEDULE", "random:7")
    assert emu.schedule() == "random:7"
    monkeypatch.setenv("SYNCTRAIN_SIMT_SCHEDULE", "sideways")
    with pytest.raises(RuntimeError, match=r"SYNCTRAIN_SIMT_SCHEDULE='sideways': expected forward, reverse, random"):
        run_order(emu, 1, 4)
    emu.set_schedule("forward")  # the module's choice wins over the environment
    try:
        assert run_order(emu, 1, 4) == [0, 1, 2, 3]
    finally:
        emu.set_schedule(None)
    monkeypatch.delenv("SYNCTRAIN_SIMT_SCHEDULE")
    assert emu.schedule() == "forward"
    with pytest.raises(RuntimeError, match=r"set_schedule='random:x': the seed after 'random:' must be"):
        emu.set_schedule("random:x")


def test_static_shared_memory_is_per_block_and_uninitialised(emu, fibers, schedule):
    """Static __shared__ is poisoned per block like dynamic shared memory: never the previous block's values."""
    blocks, threads = 3, 64
    for _ in range(2):  # the second launch finds the first one's values there
        out = torch.zeros(blocks, threads, 2, dtype=torch.int64)
        emu.probes.static_shared(out)
        assert (out[..., 0] == POISON).all()
        right = (torch.arange(threads) + 1) % threads
        assert torch.equal(out[..., 1], 1000 * torch.arange(blocks).view(-1, 1) + right.view(1, -1))


WARP_SUM = sum(100 + lane for lane in range(32))
# kind: (threads, blocks, what the fixed kernel computes, what the detector says about the bug).
RACES = {
    "syncthreads": (256, 1, [100] + [100 + t - 1 for t in range(1, 256)],
                    r"race_syncthreads_kernel block \(0, 0, 0\) thread \((\d+), 0, 0\): data race on static __shared__ "
                    r"memory at byte offset \d+ from the lowest static shared address this launch touched: thread "
                    r"\((\d+), 0, 0\) (wrote|read) it, then this thread (wrote|read) it, with no __syncthreads\(\) "
                    r"between them"),
    "syncwarp": (32, 1, [WARP_SUM] + [-7] * 31,
                 r"race_syncwarp_kernel block \(0, 0, 0\) thread \((\d+), 0, 0\): data race on static __shared__ "
                 r"memory at byte offset \d+ .*: thread \((\d+), 0, 0\) (wrote|read) it, then this thread (wrote|read) "
                 r"it, with no __syncthreads\(\) between them and no __syncwarp\(\) of both lanes"),
    # A shuffle where the __syncwarp belongs: it moves values but orders no shared memory.
    "shuffle": (32, 1, [WARP_SUM] + [-7] * 31,
                r"race_shuffle_kernel block \(0, 0, 0\) thread \((\d+), 0, 0\): data race on static __shared__ "
                r"memory at byte offset \d+ .*: thread \((\d+), 0, 0\) (wrote|read) it, then this thread (wrote|read) "
                r"it, with no __syncthreads\(\) between them and no __syncwarp\(\) of both lanes \(a shuffle "
                r"orders no memory\)"),
    "last_warp": (256, 1, [sum(100 + t for t in range(256))] + [-7] * 255,
                  r"race_last_warp_kernel block \(0, 0, 0\) thread \((\d+), 0, 0\): data race on static __shared__ "
                  r"memory at byte offset \d+ .*: thread \((\d+), 0, 0\) (wrote|read) it, then this thread "
                  r"(wrote|read) it, with no __syncthreads\(\) between them \(threads of different warps"),
    "global_write": (64, 2, list(range(128)),
                     r"race_global_write_kernel: data race on global memory: block \((\d), 0, 0\) thread "
                     r"\((\d+), 0, 0\) and block \((\d), 0, 0\) thread \((\d+), 0, 0\) both wrote byte offset 0 of "
                     r"argument 'out' of probes.race \(1024 bytes\)"),
}


@pytest.mark.parametrize("kind", sorted(RACES))
def test_correct_synchronisation_passes_every_schedule(emu, fibers, schedule, kind):
    """No false positives: the kernels with their synchronisation give the right result in every order."""
    threads, blocks, expected, _ = RACES[kind]
    out = emu.probes.race(kind, True, threads, blocks)
    assert out.tolist() == expected


@pytest.mark.parametrize("kind", sorted(RACES))
def test_missing_synchronisation_is_a_reported_race(emu, schedule, kind):
    """A removed __syncthreads, a removed __syncwarp, a shuffle in place of the __syncwarp, a reduction
    finished by the last warp without a barrier, two threads writing one global address: the launch fails
    naming kernel, address and threads, whatever the order."""
    threads, blocks, _, message = RACES[kind]
    with pytest.raises(RuntimeError, match=message) as err:
        emu.probes.race(kind, False, threads, blocks)
    ids = [int(g) for g in re.search(message, str(err.value)).groups() if g.isdigit()]
    if kind == "global_write":
        assert (ids[0], ids[1]) != (ids[2], ids[3])
    else:
        assert ids[0] != ids[1]  # two different threads
    if kind == "last_warp":
        assert ids[0] // 32 != ids[1] // 32
    if kind in ("syncwarp", "shuffle"):
        assert ids[0] // 32 == ids[1] // 32


@pytest.mark.parametrize("kind", sorted(RACES))
def test_without_the_detector_the_races_pass_silently(detector, kind):
    """The detector is what catches them: switched off, each buggy kernel runs without an error, and in
    one of the fixed orders it even computes the right answer (the order a missing barrier hides in),
    while the other order shows a wrong one (what the schedules add) -- except for the global write
    conflict and the shuffle in place of a __syncwarp (the emulator runs a shuffle as a rendezvous of the
    lanes, so every order sums right), which only the detector sees."""
    emu = detector
    threads, blocks, expected, _ = RACES[kind]
    emu.set_race_detection(False)
    results = {}
    try:
        for order in ("forward", "reverse"):
            emu.set_schedule(order)
            results[order] = emu.probes.race(kind, False, threads, blocks).tolist()
    finally:
        emu.set_schedule(None)
    if kind == "global_write":
        assert all(r[1:] == [-7] * (threads * blocks - 1) for r in results.values())
    elif kind == "shuffle":
        assert all(r == expected for r in results.values())
    else:
        assert expected in results.values()  # silently right in one order
        assert any(r != expected for r in results.values())  # wrong in the other
    emu.set_race_detection(True)
    with pytest.raises(RuntimeError, match=RACES[kind][3]):
        emu.probes.race(kind, False, threads, blocks)


def test_atomics_are_not_races(emu, schedule):
    """Every thread of several blocks adds to one address with atomicAdd: exempt from the write check."""
    count, total = torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.float64)
    emu.probes.atomic_add(count, total, 3, 64)
    assert emu.race_detection() and count.item() == 3 * 64
