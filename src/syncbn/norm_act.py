"""SyncBatchNormAct2d: our SyncBatchNorm2d followed by a `drop` and an `act` module (timm's norm+act layout).

timm builds EfficientNet, MobileNetV3, RegNetY and others from `timm.layers.BatchNormAct2d`, an
nn.BatchNorm2d subclass whose forward is batch norm -> `self.drop` -> `self.act`. Converting it to a plain
SyncBatchNorm would drop the activation (what torch.nn.SyncBatchNorm.convert_sync_batchnorm does);
leaving it alone keeps per-rank statistics. This layer keeps both submodules, so parameters, buffers and
state_dict keys are those of the BatchNormAct2d it came from (including an activation's own parameters,
e.g. PReLU's). Importing this file never imports timm.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from .modules import SyncBatchNorm2d


class SyncBatchNormAct2d(SyncBatchNorm2d):
    """SyncBatchNorm2d -> drop -> act, with timm BatchNormAct2d's submodules and state_dict keys."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1, affine: bool = True,
                 track_running_stats: bool = True, process_group: Optional[Any] = None, device: Any = None,
                 dtype: Any = None, *, bias: bool = True, act: Optional[nn.Module] = None,
                 drop: Optional[nn.Module] = None) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, process_group, device, dtype,
                         bias=bias)
        # Same registration order as BatchNormAct2d (drop, then act): same state_dict key order.
        self.drop = drop if drop is not None else nn.Identity()
        self.act = act if act is not None else nn.Identity()

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Synchronised batch norm, then drop, then the activation (BatchNormAct2d's order)."""
        return self.act(self.drop(super().forward(input)))
