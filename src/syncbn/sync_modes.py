"""Set the communication-saving modes on a model's SyncBatchNorm layers, and tell them the optimizer step.

The modes trade exactness for communication (docs/syncbn.md, "Groups and communication-saving modes"):
- group_size=k: statistics shared within groups of k consecutive ranks (Apex's `group_size`);
- sync_every=N: statistics synchronised on every N-th training forward, this rank's batch otherwise;
- sync_until_step=S: synchronised for the first S optimizer steps, per-rank statistics after.
The defaults (None, 1, None) are the exact behaviour: every training forward synchronises over the
layer's process group.
"""
from __future__ import annotations

from typing import Optional

from torch import nn

from .groups import check_group_size
from .modules import SyncBatchNorm


def configure_sync(module: nn.Module, *, group_size: Optional[int] = None, sync_every: int = 1,
                   sync_until_step: Optional[int] = None) -> int:
    """Set the three modes on every SyncBatchNorm layer in `module`; returns how many layers were set.

    group_size needs its groups created on every rank after init_process_group (`create_rank_groups`)
    before the first training forward; setting it here communicates nothing.
    """
    check_group_size(group_size)  # the world size is checked where the groups are created
    if not isinstance(sync_every, int) or sync_every < 1:
        raise ValueError(f"sync_every must be an int >= 1 (1 = every training forward), got {sync_every!r}")
    if sync_until_step is not None and (not isinstance(sync_until_step, int) or sync_until_step < 0):
        raise ValueError(f"sync_until_step must be an int >= 0 or None (always), got {sync_until_step!r}")
    layers = [m for m in module.modules() if isinstance(m, SyncBatchNorm)]
    for layer in layers:
        layer.group_size = group_size
        layer.sync_every = sync_every
        layer.sync_until_step = sync_until_step
        if sync_every > 1:
            layer.reset_sync_phase()  # from num_batches_tracked, now rather than in a training step
        else:
            layer._forwards = None
    return len(layers)


def set_optimizer_step(module: nn.Module, step: int) -> None:
    """Tell every SyncBatchNorm layer in `module` how many optimizer steps are done (for sync_until_step).

    Call it on every rank with the same step: after each optimizer step and after a resume. Plain
    attribute writes, no communication.
    """
    for layer in module.modules():
        if isinstance(layer, SyncBatchNorm):
            layer.optimizer_step = int(step)
