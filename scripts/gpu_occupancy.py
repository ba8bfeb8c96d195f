"""Resident blocks per SM of every SyncBN CUDA kernel on cuda:0, from the extension's kernel_occupancy()
(cudaOccupancyMaxActiveBlocksPerMultiprocessor, registers and local memory per thread). Run by
scripts/gpu_check.sh (`make gpu-check`).

    python scripts/gpu_occupancy.py OUT.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from src.syncbn.extension import load_extension


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("gpu_occupancy: no CUDA GPU visible", file=sys.stderr)
        return 2
    table = load_extension().kernel_occupancy(0)
    Path(sys.argv[1]).write_text(json.dumps({"device": torch.cuda.get_device_name(0), "kernels": table}, indent=1) + "\n")
    for k in table:
        print(f"{k['kernel']:<45} {k['blocks_per_sm']:>2} blocks x {k['block_threads']} threads/SM "
              f"({k['occupancy']:.0%}), {k['registers']} registers, {k['local_bytes']} B local")
    # launch.cuh sizes each grid by these blocks_per_sm; list the kernels that registers or shared memory
    # keep below what the SM's thread slots allow.
    short = [k["kernel"] for k in table if k["blocks_per_sm"] < k["max_threads_per_sm"] // k["block_threads"]]
    print(f"{len(short)} of {len(table)} kernels fit fewer blocks per SM than the thread slots allow (grids follow)"
          + (f": {', '.join(short)}" if short else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
