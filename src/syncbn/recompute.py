"""Activation checkpointing: a recomputed training forward reuses the first forward's statistics.

torch.utils.checkpoint (use_reentrant=False) drops a region's saved tensors in the forward and runs the
region again when the backward needs them. Run naively, a BatchNorm layer in the region would update its
running statistics and num_batches_tracked a second time, and SyncBatchNorm would repeat its all_gather
(pytorch/pytorch#96136). Here, as fairscale does for BatchNorm, the first forward keeps its global
statistics and the recomputation reuses them:

- A recomputation runs while the autograd engine is executing a backward (the checkpoint's unpack hook
  calls it), so a training forward that finds `torch._C._current_graph_task_id() != -1` is one. Nothing
  else runs a model's training forward inside a backward.
- Each training forward with autograd on records its (mean, invstd, count) in a `ForwardStatistics`
  owned by its autograd node (the node outlives the checkpoint's dropped tensors and dies with the
  graph); the layer keeps a weak reference. The node's backward marks it consumed.
- The recomputation takes the layer's one pending record. A layer normally runs once per forward and
  each backward finishes before the next forward, so there is exactly one; two pending records (a layer
  applied twice in a checkpointed model, or two forwards before one backward) cannot be told apart by
  order alone, so that raises instead of guessing.

torch's own BatchNorm layers get the same rule through `guard_batchnorm_recompute` (torch_bn_recompute.py): while recomputed,
they normalise with the batch's own statistics (bit-identical to the first forward, no communication:
the batch is local) but neither update running statistics nor count the batch. (nn.SyncBatchNorm,
norm=torch_syncbn, keeps its running statistics exact the same way but repeats its own collective.)
"""
from __future__ import annotations

import weakref
from typing import Optional

import torch
from torch import nn


class ForwardStatistics:
    """One training forward's global statistics, kept for a recomputation of that forward."""

    __slots__ = ("mean", "invstd", "count", "consumed", "__weakref__")

    def __init__(self) -> None:
        self.mean: Optional[torch.Tensor] = None
        self.invstd: Optional[torch.Tensor] = None
        self.count: Optional[torch.Tensor] = None
        self.consumed = False  # its backward has run: no recomputation can need it any more

    def stats(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(mean, invstd, count) as the first forward computed them."""
        assert self.mean is not None and self.invstd is not None and self.count is not None
        return self.mean, self.invstd, self.count


def recomputing() -> bool:
    """True while the autograd engine runs a backward on this thread, i.e. inside a checkpoint's recomputation."""
    return torch._C._current_graph_task_id() != -1


class StatisticsLedger:
    """A layer's weak references to its recorded forwards whose backward has not run yet."""

    def __init__(self) -> None:
        self._records: list[weakref.ref[ForwardStatistics]] = []

    def _pending(self) -> list[ForwardStatistics]:
        live = [r() for r in self._records]
        return [s for s in live if s is not None and not s.consumed]

    def record(self) -> ForwardStatistics:
        """A new record for the forward about to run (the autograd node will own it)."""
        pending = self._pending()  # drops the dead and consumed ones: the list stays short
        stats = ForwardStatistics()
        self._records = [weakref.ref(s) for s in pending] + [weakref.ref(stats)]
        return stats

    def take(self, layer: str) -> Optional[ForwardStatistics]:
        """The record a recomputation of this layer reuses; None when this forward has none (not a recomputation)."""
        pending = [s for s in self._pending() if s.mean is not None]
        if not pending:
            return None
        if len(pending) > 1:
            raise RuntimeError(
                f"{layer} is being recomputed (activation checkpointing) while {len(pending)} of its training "
                "forwards wait for their backward, so it cannot tell which forward's statistics to reuse; "
                "apply each BatchNorm layer once per forward and run each backward before the next forward"
            )
        return pending[0]


# Kept outside the layers, so a layer's __dict__ (deepcopy, pickling, state_dict) never holds weak references.
_LEDGERS: "weakref.WeakKeyDictionary[nn.Module, StatisticsLedger]" = weakref.WeakKeyDictionary()


def ledger_of(layer: nn.Module) -> StatisticsLedger:
    """The ledger of `layer` (created on first use; it goes when the layer goes)."""
    ledger = _LEDGERS.get(layer)
    if ledger is None:
        ledger = _LEDGERS[layer] = StatisticsLedger()
    return ledger
