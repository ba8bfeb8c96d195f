"""Norm synchronisation in a training run, in one place: which BatchNorm statistics can differ between ranks,
SyncBN's process groups and step-dependent modes (norm.group_size, norm.sync_until_step), and making per-rank
running statistics equal before evaluations and checkpoints (trainer.norm_buffer_sync).

The layers themselves synchronise inside their forward (src/syncbn/); this module is the training loop's
side of it. Checking that ranks agree is src/engine/norm_health.py's job.
"""
from __future__ import annotations

from typing import Any

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from src import comm
from src.engine.hooks import Hook, TrainerView
from src.models.config import NormConfig
from src.syncbn import create_rank_groups, create_stats_group, set_optimizer_step


def per_rank_statistics(norm_cfg: NormConfig, world_size: int) -> bool:
    """True when BatchNorm running statistics may differ between ranks, so they need syncing before evaluation:
    norm=bn, or norm=syncbn with groups smaller than the world or with sync_every / sync_until_step."""
    if world_size == 1 or norm_cfg.name not in ("bn", "syncbn"):
        return False
    return norm_cfg.name == "bn" or ((norm_cfg.group_size or world_size) < world_size or norm_cfg.sync_every > 1
                                     or norm_cfg.sync_until_step is not None)


def buffer_sync_mode(cfg: Any) -> str:
    """How per-rank BN statistics are made equal before evaluations and checkpoints: trainer.norm_buffer_sync
    when they can differ (norm=bn, or syncbn with small groups or a communication-saving mode; see
    per_rank_statistics) and DDP does not broadcast buffers every forward, else "none"."""
    if per_rank_statistics(cfg.norm, comm.get_world_size()) and not cfg.trainer.broadcast_buffers:
        return cfg.trainer.norm_buffer_sync
    return "none"


def sync_bn_buffers(model: nn.Module, mode: str) -> int:
    """Make BN running statistics equal on all ranks: "reduce" averages them, "broadcast" takes rank 0's.

    Needed only for per-rank BN (norm=bn without DDP's broadcast_buffers): each rank's running stats
    then saw only its own shard. Returns the number of layers synchronised (a collective).
    """
    if mode == "none" or comm.get_world_size() == 1:
        return 0
    layers = [m for m in model.modules() if isinstance(m, _BatchNorm) and m.track_running_stats
              and m.running_mean is not None]
    for layer in layers:
        for buf in (layer.running_mean, layer.running_var):
            if mode == "reduce":
                flat = buf.detach().double()
                comm.all_reduce(flat, "mean")
            else:
                flat = comm.all_gather_tensor(buf.detach().reshape(1, -1))[0].reshape(buf.shape)
            buf.copy_(flat.to(buf.dtype))
    return len(layers)


def create_norm_groups(norm_cfg: NormConfig, timeout_s: float | None = None) -> None:
    """Create norm=syncbn's process groups: norm.group_size's rank groups, else one group for SyncBN's
    statistics alone; nothing for other norms or without a process group.

    A collective: every rank calls it once, after init_distributed and before the first forward (every rank
    creates every group).
    """
    if norm_cfg.name != "syncbn" or not comm.is_initialized():
        return
    if norm_cfg.group_size is not None:
        create_rank_groups(norm_cfg.group_size, timeout_s)
    else:
        # SyncBN's collectives on a group of their own, not queued behind DDP's gradient buckets
        # (docs/benchmarks.md, "SyncBN's synchronisation cost").
        create_stats_group(timeout_s)


class NormSyncHook(Hook):
    """Tells norm=syncbn's layers how many optimizer steps are done (norm.sync_until_step), after a resume
    and after every step; a no-op for every other norm setting."""

    def __init__(self, norm_cfg: NormConfig) -> None:
        self.tracks_steps = norm_cfg.name == "syncbn" and norm_cfg.sync_until_step is not None

    def before_train(self, trainer: TrainerView) -> None:
        self._tell_step(trainer)

    def after_step(self, trainer: TrainerView) -> None:
        self._tell_step(trainer)

    def _tell_step(self, trainer: TrainerView) -> None:
        if self.tracks_steps:  # the same number on every rank
            set_optimizer_step(trainer.state.model, trainer.state.progress.step)
