"""torch's own BatchNorm layers under activation checkpointing: while recomputed, they normalise with their batch
statistics as before but neither update running statistics nor count the batch a second time.

Apart from recompute.py because it must tell our SyncBatchNorm (which handles recomputation itself, through the
ledger in recompute.py) from torch's layers, and modules.py already imports recompute.py.
"""
from __future__ import annotations

from typing import Any

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from .modules import SyncBatchNorm
from .recompute import recomputing


def _freeze_running_stats(module: _BatchNorm, args: Any) -> None:
    if module.training and module.track_running_stats and recomputing():
        # momentum 0 makes the update `running = 1 * running + 0 * batch`, i.e. no change, while the op
        # keeps its running-stat arguments (the checkpoint checks that the recomputation saves exactly
        # the tensors the first forward saved). The forward hook undoes the count and the momentum.
        module._recompute_momentum = (module.momentum,)
        module.momentum = 0.0


def _restore_running_stats(module: _BatchNorm, args: Any, output: Any) -> None:
    saved = module.__dict__.pop("_recompute_momentum", None)
    if saved is not None:
        module.momentum = saved[0]
        if module.num_batches_tracked is not None:
            module.num_batches_tracked.sub_(1)  # _BatchNorm.forward counted the recomputation


def guard_batchnorm_recompute(model: nn.Module) -> int:
    """Make torch's BatchNorm layers in `model` skip the running-statistics update when recomputed; returns how many.

    Our SyncBatchNorm handles recomputation itself and is left alone. A layer outside any checkpointed
    region never runs inside a backward, so the hooks change nothing there.
    """
    count = 0
    for module in model.modules():
        if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
            if getattr(module, "_recompute_guarded", False):
                continue
            module.register_forward_pre_hook(_freeze_running_stats)
            module.register_forward_hook(_restore_running_stats, always_call=True)
            module._recompute_guarded = True
            count += 1
    return count
