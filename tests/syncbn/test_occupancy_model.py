"""The emulated build's kernel_occupancy() (its device model of cudaOccupancyMaxActiveBlocksPerMultiprocessor)
against the registers ptxas gave the real kernels for sm_90 (H100/H200).

The CUDA variant is built as tests/syncbn/test_cuda_build.py builds it (same cache: compiled once for both;
minutes when it compiles, hence `slow`), and each kernel's register count is read from the cubins in its
objects (cubin_registers.py). Given those counts (registers.NAME=N), the emulated H100 must report every
kernel of kernel_occupancy() with exactly ptxas's registers and the blocks per SM that CUDA's occupancy
arithmetic gives on sm_90 (64K registers allocated per warp in units of 256, 2048 threads, 32 blocks); the
16-bit channels-last reductions must fit 2 blocks of 256 threads (docs/gpu.md), and the self-check's
device-sized case follows from the same table (selfcheck_cases.stats_resident_blocks).
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from src.syncbn import selfcheck_cases as sc
from src.syncbn.extension import load_emulated_cuda_extension
from tests.syncbn.cubin_registers import kernel_registers
from tests.syncbn.test_cuda_build import BUILD, TOOLKIT, build_cache

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow, pytest.mark.cuda_emulated,
    pytest.mark.skipif(TOOLKIT is None, reason="no CUDA toolkit found (set CUDA_HOME); nothing to compile with"),
]


def sm90_blocks_per_sm(registers: int, threads: int) -> int:
    """Resident blocks of `threads` threads per sm_90 SM for a kernel of `registers` per thread (no shared
    memory): CUDA's occupancy arithmetic for that architecture."""
    warps = math.ceil(threads / 32)
    per_warp = math.ceil(registers * 32 / 256) * 256
    return min(2048 // threads, 65536 // per_warp // warps, 32)


@pytest.fixture(scope="module")
def ptxas_registers() -> dict[str, int]:
    """Kernel -> registers per thread in the sm_90 build (built here if the cache lacks it)."""
    env = dict(os.environ, TORCH_CUDA_ARCH_LIST="9.0", SYNCTRAIN_EXTENSIONS_DIR=str(build_cache()),
               PYTHONPATH=str(REPO))
    env.setdefault("MAX_JOBS", str(min(os.cpu_count() or 1, 4)))
    built = subprocess.run([sys.executable, "-c", BUILD], cwd=REPO, env=env, capture_output=True, text=True)
    assert built.returncode == 0, f"CUDA build failed:\n{built.stdout[-2000:]}\n{built.stderr[-6000:]}"
    library = Path([line.split(" ", 1)[1] for line in built.stdout.splitlines() if line.startswith("LIBRARY ")][-1])
    registers = kernel_registers(sorted(library.parent.glob("*.cuda.o")))
    assert len(registers) > 40, registers  # every instantiation of the seven ops' kernels
    return registers


def test_the_emulated_occupancy_follows_ptxas_registers(ptxas_registers):
    spec = "h100," + ",".join(f"registers.{name}={count}" for name, count in ptxas_registers.items())
    emu = load_emulated_cuda_extension(spec)
    try:
        table = emu.kernel_occupancy()
    finally:
        emu.set_device("h100")
    assert len(table) >= 20
    for entry in table:
        name = entry["launch_name"]
        assert name in ptxas_registers, (entry, "a kernel of kernel_occupancy() is not in the build")
        assert entry["registers"] == ptxas_registers[name], entry
        assert entry["blocks_per_sm"] == sm90_blocks_per_sm(entry["registers"], entry["block_threads"]), entry
    by_name = {entry["kernel"]: entry for entry in table}
    for reduction in ("stats_channels_last<bfloat16,8>", "backward_reduce_channels_last<bfloat16,8>"):
        assert by_name[reduction]["blocks_per_sm"] == 2, by_name[reduction]
    # The self-check's device case on an H200 follows from the same table.
    resident = sc.stats_resident_blocks(table, 132, 2048)
    assert resident[torch.bfloat16] == 132 * by_name["stats_channels_last<bfloat16,8>"]["blocks_per_sm"]
    rows = sc.unroll_rows(resident)
    unroll = sc.device_cases(resident)[1]
    assert unroll.shape[0] * unroll.shape[2] * unroll.shape[3] >= rows > 3 * 128 * resident[torch.bfloat16]
