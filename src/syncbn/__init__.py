"""Synchronized BatchNorm: modules, autograd function, collectives and the kernel extension loader.

    from src.syncbn import SyncBatchNorm2d, convert_sync_batchnorm
    model = convert_sync_batchnorm(model)  # every nn.BatchNormXd -> SyncBatchNormXd, same tensors

See docs/syncbn.md for semantics, the gradient convention, groups and the communication-saving modes,
and the differences from nn.SyncBatchNorm.
"""

from .convert import UnconvertedBatchNormWarning, convert_sync_batchnorm, revert_sync_batchnorm
from .groups import create_rank_groups, create_stats_group, release_groups
from .modules import SyncBatchNorm, SyncBatchNorm1d, SyncBatchNorm2d, SyncBatchNorm3d
from .norm_act import SyncBatchNormAct2d
from .out_of_step import (SyncBatchNormOutOfStepError, check_in_step, number_layers, out_of_step_count,
                          out_of_step_layers)
from .sync_modes import configure_sync, set_optimizer_step

__all__ = [
    "SyncBatchNorm",
    "SyncBatchNorm1d",
    "SyncBatchNorm2d",
    "SyncBatchNorm3d",
    "SyncBatchNormAct2d",
    "SyncBatchNormOutOfStepError",
    "UnconvertedBatchNormWarning",
    "check_in_step",
    "configure_sync",
    "convert_sync_batchnorm",
    "create_rank_groups",
    "create_stats_group",
    "number_layers",
    "out_of_step_count",
    "out_of_step_layers",
    "release_groups",
    "revert_sync_batchnorm",
    "set_optimizer_step",
]
