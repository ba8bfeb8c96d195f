"""The module the forward pass goes through: the model, in DistributedDataParallel when distributed."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from src import comm
from src.config import TrainerConfig


def wrap_model(model: nn.Module, settings: TrainerConfig, device: torch.device) -> nn.Module:
    """DDP around the (already norm-converted) model when there is more than one process, else the model.

    DDP broadcasts rank 0's parameters and buffers once here; `trainer.broadcast_buffers` decides
    whether it also re-broadcasts buffers at every forward (forward_sync_buffers). torch.compile, when
    used, belongs around the returned module, so that DDP's gradient buckets see the compiled graph.
    """
    if comm.get_world_size() == 1:
        return model
    return DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=settings.ddp_bucket_cap_mb, gradient_as_bucket_view=settings.gradient_as_bucket_view,
        forward_sync_buffers=settings.broadcast_buffers)
