"""One GPU per process on a node: refuse a launch with more local processes than visible GPUs.

`select_device` gives local rank r the GPU r % device_count(); with more processes than GPUs two ranks
would share one, which NCCL rejects much later with an obscure error (or which silently halves each
rank's memory). This check runs before any process group forms: at config validation and in
select_device.
"""
from __future__ import annotations

import os
from typing import Optional

import torch

from src.errors import UserError


def check_processes_fit_gpus(device: str = "auto", local_world_size: Optional[int] = None,
                             device_count: Optional[int] = None) -> None:
    """Raise UserError when `device` ("auto" | "cuda") would put two of this node's processes on one GPU.

    "cpu" and an explicit "cuda:N" (the user's own choice) are not checked; "auto" is only when CUDA is
    available (else it means the CPU). local_world_size defaults to torchrun's LOCAL_WORLD_SIZE (1 without
    it), device_count to torch.cuda.device_count().
    """
    if device not in ("auto", "cuda") or (device == "auto" and not torch.cuda.is_available()):
        return
    procs = int(os.environ.get("LOCAL_WORLD_SIZE", 1)) if local_world_size is None else local_world_size
    gpus = torch.cuda.device_count() if device_count is None else device_count
    if gpus < 1 or procs <= gpus:
        return  # no GPU at all is select_device's own error (CUDA not available)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    raise UserError(
        f"this node runs {procs} processes (LOCAL_WORLD_SIZE={procs}) but only {gpus} GPU"
        f"{'s are' if gpus != 1 else ' is'} visible (torch.cuda.device_count()={gpus}"
        f"{f', CUDA_VISIBLE_DEVICES={visible}' if visible is not None else ''}): two processes would share "
        f"one GPU, which NCCL refuses. Start at most {gpus} per node (torchrun --nproc_per_node={gpus}), make "
        f"more GPUs visible (CUDA_VISIBLE_DEVICES), or train on the CPU (device=cpu).")
