"""Synchronized BatchNorm: modules, autograd function, collectives and the kernel extension loader.

    from src.syncbn import SyncBatchNorm2d, convert_sync_batchnorm
    model = convert_sync_batchnorm(model)  # every nn.BatchNormXd -> SyncBatchNormXd, same tensors

See docs/syncbn.md for semantics, the gradient convention and the differences from nn.SyncBatchNorm.
"""
from .convert import convert_sync_batchnorm, revert_sync_batchnorm
from .modules import SyncBatchNorm, SyncBatchNorm1d, SyncBatchNorm2d, SyncBatchNorm3d

__all__ = [
    "SyncBatchNorm",
    "SyncBatchNorm1d",
    "SyncBatchNorm2d",
    "SyncBatchNorm3d",
    "convert_sync_batchnorm",
    "revert_sync_batchnorm",
]
