"""Seeds, determinism switches and CPU thread counts for one training process."""
from __future__ import annotations

import logging
import os
import random

import numpy as np
import torch

log = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and every GPU)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def configure_determinism(deterministic: bool) -> None:
    """Deterministic kernels (a run repeats bit for bit) or cuDNN autotuning (faster, not repeatable)."""
    torch.backends.cudnn.benchmark = not deterministic
    torch.backends.cudnn.deterministic = deterministic
    if deterministic:
        # cuBLAS needs a fixed workspace to be deterministic; must be set before its first use.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        # warn_only: an op without a deterministic implementation warns instead of killing a long run.
        torch.use_deterministic_algorithms(True, warn_only=True)


def configure_threads(requested: int, local_world_size: int) -> int:
    """Intra-op CPU threads per process: `requested`, else this process's cores / processes on the node.

    Two processes each using every core oversubscribe the CPU and run slower than one thread each.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = requested if requested > 0 else max(1, cores // max(local_world_size, 1))
    torch.set_num_threads(threads)
    return threads
