"""The module the forward pass goes through: the model, in DistributedDataParallel when distributed."""
from __future__ import annotations

import inspect

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from src import comm
from src.config import TrainerConfig

# DDP's forward_sync_buffers (PyTorch 2.13 on) re-broadcasts buffers at each forward and leaves the one sync at
# construction alone; before it (2.11), broadcast_buffers decided both.
_HAS_FORWARD_SYNC_BUFFERS = "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters


def wrap_model(model: nn.Module, settings: TrainerConfig, device: torch.device) -> nn.Module:
    """DDP around the (already norm-converted) model when there is more than one process, else the model.

    DDP broadcasts rank 0's parameters and buffers once here; `trainer.broadcast_buffers` decides
    whether it also re-broadcasts buffers at every forward (forward_sync_buffers). torch.compile, when
    used, belongs around the returned module, so that DDP's gradient buckets see the compiled graph.
    """
    if comm.get_world_size() == 1:
        return model
    common = dict(device_ids=[device.index] if device.type == "cuda" else None,
                  bucket_cap_mb=settings.ddp_bucket_cap_mb, gradient_as_bucket_view=settings.gradient_as_bucket_view)
    if _HAS_FORWARD_SYNC_BUFFERS:
        return DistributedDataParallel(model, **common, forward_sync_buffers=settings.broadcast_buffers)
    # PyTorch 2.11: constructed with broadcast_buffers=True, so the buffers are synced once as above; then the
    # sync at each forward is kept or dropped (DDP reads the attribute at every forward: will_sync_module_buffers).
    wrapped = DistributedDataParallel(model, **common, broadcast_buffers=True)
    wrapped.broadcast_buffers = settings.broadcast_buffers
    return wrapped
