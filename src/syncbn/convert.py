"""Swap plain BatchNorm layers for SyncBatchNorm layers and back, keeping the very same tensors.

Only exact classes are swapped (nn.BatchNorm1d/2d/3d, nn.SyncBatchNorm and ours): a user subclass of
_BatchNorm may carry its own forward, and an uninitialised LazyBatchNorm has no tensors to keep yet
(after its first forward it *is* an nn.BatchNormXd and converts normally). Both are left as they are.
"""
from __future__ import annotations

from typing import Any, Optional

import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

from .modules import SyncBatchNorm, SyncBatchNorm1d, SyncBatchNorm2d, SyncBatchNorm3d

_TO_SYNC: dict[type, type] = {
    nn.BatchNorm1d: SyncBatchNorm1d,
    nn.BatchNorm2d: SyncBatchNorm2d,
    nn.BatchNorm3d: SyncBatchNorm3d,
    nn.SyncBatchNorm: SyncBatchNorm,
}
# Our generic layer goes back to nn.SyncBatchNorm: it is the only PyTorch layer that, like ours,
# accepts 2-D to 5-D input, and it makes convert/revert a round trip for nn.SyncBatchNorm models.
# Without a process group (or in eval mode) nn.SyncBatchNorm is plain batch norm on any device.
_TO_PLAIN: dict[type, type] = {
    SyncBatchNorm1d: nn.BatchNorm1d,
    SyncBatchNorm2d: nn.BatchNorm2d,
    SyncBatchNorm3d: nn.BatchNorm3d,
    SyncBatchNorm: nn.SyncBatchNorm,
}


def _swap(bn: _BatchNorm, new_cls: type, **extra: Any) -> _BatchNorm:
    """A `new_cls` layer holding bn's own Parameter and buffer objects, flags, qconfig and training mode."""
    # Built on the meta device: its fresh tensors are replaced right away, so allocate none.
    new = new_cls(
        bn.num_features, bn.eps, bn.momentum, bn.affine, bn.track_running_stats,
        device="meta", bias=bn.bias is not None, **extra,
    )
    for name in ("weight", "bias"):
        setattr(new, name, getattr(bn, name))  # the same Parameter (or None): optimizers keep tracking it
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        new._buffers[name] = bn._buffers.get(name)
    new.training = bn.training
    if hasattr(bn, "qconfig"):
        new.qconfig = bn.qconfig
    return new


def convert_sync_batchnorm(module: nn.Module, process_group: Optional[Any] = None) -> nn.Module:
    """Replace every nn.BatchNorm1d/2d/3d (and nn.SyncBatchNorm) in `module` by our SyncBatchNorm layers.

    Returns the module itself, or the new layer when `module` is itself a batch norm. For an
    nn.SyncBatchNorm, `process_group=None` keeps the group it already had.
    """
    out = module
    cls = _TO_SYNC.get(type(module))
    if cls is not None:
        group = process_group if process_group is not None else getattr(module, "process_group", None)
        out = _swap(module, cls, process_group=group)  # type: ignore[arg-type]
    elif isinstance(module, SyncBatchNorm) and process_group is not None:
        module.process_group = process_group  # already ours: only the group changes
    for name, child in module.named_children():
        out.add_module(name, convert_sync_batchnorm(child, process_group))
    return out


def revert_sync_batchnorm(module: nn.Module) -> nn.Module:
    """Replace our SyncBatchNorm layers by PyTorch's (1d/2d/3d -> nn.BatchNormXd, generic -> nn.SyncBatchNorm).

    Returns the module itself, or the new layer when `module` is itself one of ours.
    """
    out = module
    cls = _TO_PLAIN.get(type(module))
    if cls is not None:
        extra = {"process_group": module.process_group} if cls is nn.SyncBatchNorm else {}
        out = _swap(module, cls, **extra)  # type: ignore[arg-type]
    for name, child in module.named_children():
        out.add_module(name, revert_sync_batchnorm(child))
    return out
