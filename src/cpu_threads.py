"""CPU threads per training, evaluation or prediction process: a share of the node's cores, not all of them."""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

import torch


def configure_threads(requested: int, local_world_size: int) -> int:
    """Intra-op CPU threads per process: `requested`, else this process's cores / processes on the node.

    Two processes each using every core oversubscribe the CPU and run slower than one thread each.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = requested if requested > 0 else max(1, cores // max(local_world_size, 1))
    torch.set_num_threads(threads)
    return threads


@contextmanager
def fixed_threads(threads: int) -> Iterator[None]:
    """Run the block with `threads` intra-op CPU threads (0: leave the count as it is), then restore it.

    Evaluation and prediction use it so that their arithmetic does not depend on the world size: oneDNN,
    the BLAS and torch's reductions split work by thread count, so a convolution's float32 output can differ
    in its last bits between 1 and 2 threads, while configure_threads gives each process cores / processes.
    """
    before = torch.get_num_threads()
    if threads > 0:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
