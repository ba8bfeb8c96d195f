"""Swap BatchNorm layers for SyncBatchNorm layers and back, keeping the very same tensors.

Only classes known to be safe are swapped: nn.BatchNorm1d/2d/3d, nn.SyncBatchNorm and, when timm is in
use, timm's norm+activation layers (BatchNormAct2d, and SyncBatchNormAct from timm's own converter),
whose `drop` and `act` submodules are kept. Any other `_BatchNorm` subclass may carry its own forward
(timm's SplitBatchNorm2d routes parts of the batch to auxiliary layers), and an uninitialised
LazyBatchNorm has no tensors to keep yet (after its first forward it *is* an nn.BatchNormXd and converts
normally): such layers are left as they are, with one warning naming every one of them, or an error
with `strict=True`. timm is never imported here: its classes are looked up among the modules Python
has already imported, because a model holding timm layers has imported timm.
"""
from __future__ import annotations

import importlib
import sys
import warnings
from typing import Any, Optional

import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

from .modules import SyncBatchNorm, SyncBatchNorm1d, SyncBatchNorm2d, SyncBatchNorm3d
from .norm_act import SyncBatchNormAct2d
from .out_of_step import number_layers

_TIMM_NORM_ACT = "timm.layers.norm_act"

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


class UnconvertedBatchNormWarning(UserWarning):
    """convert_sync_batchnorm left `_BatchNorm` subclasses it cannot prove safe as per-rank layers."""


def _timm_to_sync() -> dict[type, type]:
    """timm's norm+act BatchNorm classes -> ours, if timm has been imported (else nothing to convert)."""
    norm_act = sys.modules.get(_TIMM_NORM_ACT)
    if norm_act is None:
        return {}
    # timm's SyncBatchNormAct only ever wraps a BatchNormAct2d (timm's converter makes it from one).
    return {getattr(norm_act, name): SyncBatchNormAct2d for name in ("BatchNormAct2d", "SyncBatchNormAct")
            if isinstance(getattr(norm_act, name, None), type)}


def _timm_batchnorm_act2d() -> type:
    """timm.layers.BatchNormAct2d, importing timm (reverting a SyncBatchNormAct2d needs it)."""
    try:
        return importlib.import_module(_TIMM_NORM_ACT).BatchNormAct2d
    except ImportError as err:
        raise ImportError(f"revert_sync_batchnorm turns SyncBatchNormAct2d back into timm's BatchNormAct2d, but "
                          f"timm cannot be imported ({err}); install it: pip install 'timm>=1.0,<2'") from err


def _swap(bn: _BatchNorm, new_cls: type, **extra: Any) -> _BatchNorm:
    """A `new_cls` layer holding bn's own Parameter, buffer and drop/act objects, flags, qconfig and mode."""
    if new_cls.__module__.startswith("timm."):  # BatchNormAct2d: no `bias` argument; act/drop set below
        extra.setdefault("apply_act", False)
    else:
        extra.setdefault("bias", bn.bias is not None)
    # Built on the meta device: its fresh tensors are replaced right away, so allocate none.
    new = new_cls(bn.num_features, bn.eps, bn.momentum, bn.affine, bn.track_running_stats, device="meta", **extra)
    for name in ("weight", "bias"):
        setattr(new, name, getattr(bn, name))  # the same Parameter (or None): optimizers keep tracking it
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        new._buffers[name] = bn._buffers.get(name)
    if hasattr(new, "act"):  # norm+act layers: the same submodules (an activation may have parameters)
        for name in ("drop", "act"):
            part = getattr(bn, name, None)
            setattr(new, name, part if part is not None else nn.Identity())
    new.training = bn.training
    if hasattr(bn, "qconfig"):
        new.qconfig = bn.qconfig
    return new


def convert_sync_batchnorm(module: nn.Module, process_group: Optional[Any] = None, *,
                           strict: bool = False) -> nn.Module:
    """Replace every nn.BatchNorm1d/2d/3d, nn.SyncBatchNorm and timm norm+act BatchNorm in `module` by ours.

    Returns the module itself, or the new layer when `module` is itself a batch norm. For an
    nn.SyncBatchNorm, `process_group=None` keeps the group it already had. Other `_BatchNorm` subclasses
    stay per-rank: one UnconvertedBatchNormWarning names each of them and its class, or, with
    strict=True, a TypeError does (and nothing is converted).
    """
    table = {**_TO_SYNC, **_timm_to_sync()}
    skipped = [(name or "<root>", type(m)) for name, m in module.named_modules()
               if isinstance(m, _BatchNorm) and not isinstance(m, SyncBatchNorm) and type(m) not in table]
    if skipped:
        listing = ", ".join(f"{name} ({cls.__module__}.{cls.__qualname__})" for name, cls in skipped)
        message = (f"convert_sync_batchnorm cannot prove {len(skipped)} BatchNorm subclass layer(s) safe to "
                   f"synchronise, so they keep per-rank statistics: {listing}. A Lazy layer converts after its "
                   "first forward; for your own subclass, convert it yourself or use plain nn.BatchNormXd")
        if strict:
            raise TypeError(message + " (strict=True)")
        warnings.warn(message, UnconvertedBatchNormWarning, stacklevel=2)
    converted = _convert(module, process_group, table)
    number_layers(converted)  # each layer's position: the identity its exchanges carry (out_of_step.py)
    return converted


def _convert(module: nn.Module, process_group: Optional[Any], table: dict[type, type]) -> nn.Module:
    out = module
    cls = table.get(type(module))
    if cls is not None:
        group = process_group if process_group is not None else getattr(module, "process_group", None)
        out = _swap(module, cls, process_group=group)  # type: ignore[arg-type]
    elif isinstance(module, SyncBatchNorm) and process_group is not None:
        module.process_group = process_group  # already ours: only the group changes
    for name, child in module.named_children():  # a norm+act layer's drop/act come back as they are
        out.add_module(name, _convert(child, process_group, table))
    return out


def revert_sync_batchnorm(module: nn.Module) -> nn.Module:
    """Replace our SyncBatchNorm layers by PyTorch's (1d/2d/3d -> nn.BatchNormXd, generic -> nn.SyncBatchNorm)
    and SyncBatchNormAct2d by timm's BatchNormAct2d. Returns the module itself, or the new layer when `module`
    is itself one of ours.
    """
    out = module
    cls = _timm_batchnorm_act2d() if type(module) is SyncBatchNormAct2d else _TO_PLAIN.get(type(module))
    if cls is not None:
        extra = {"process_group": module.process_group} if cls is nn.SyncBatchNorm else {}
        out = _swap(module, cls, **extra)  # type: ignore[arg-type]
    for name, child in module.named_children():
        out.add_module(name, revert_sync_batchnorm(child))
    return out
