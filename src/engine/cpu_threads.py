"""CPU threads per training, evaluation or prediction process: a share of the node's cores, not all of them."""
from __future__ import annotations

import os

import torch


def configure_threads(requested: int, local_world_size: int) -> int:
    """Intra-op CPU threads per process: `requested`, else this process's cores / processes on the node.

    Two processes each using every core oversubscribe the CPU and run slower than one thread each.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = requested if requested > 0 else max(1, cores // max(local_world_size, 1))
    torch.set_num_threads(threads)
    return threads
