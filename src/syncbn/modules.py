"""SyncBatchNorm modules: state and argument checks; the maths lives in functions.py.

Drop-in for nn.BatchNormXd / nn.SyncBatchNorm: same constructor, parameters, buffers and state_dict
keys, so checkpoints move freely between `norm=bn` and `norm=syncbn`. Unlike nn.SyncBatchNorm it
runs on the CPU (gloo) as well as on GPUs, and uneven or empty per-rank batches are exact.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from .collectives import resolve_group
from .functions import sync_batch_norm


class SyncBatchNorm(_BatchNorm):
    """Batch norm whose training statistics span every rank of `process_group` (default: WORLD).

    Accepts (N, C) to (N, C, D, H, W) input. In training mode it equals nn.BatchNorm applied to the
    concatenation of all ranks' batches; in eval mode it uses the running statistics and never
    communicates. Without a process group, or in a group of one, it is plain batch norm.
    `process_group=None` is resolved to WORLD at forward time, so a model may be built before
    init_process_group.
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: Optional[float] = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        process_group: Optional[Any] = None,
        device: Any = None,
        dtype: Any = None,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__(
            num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype, bias=bias
        )
        self.process_group = process_group

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def _check_channels(self, input: torch.Tensor) -> None:
        if input.size(1) == 0:
            raise ValueError("SyncBatchNorm number of input channels should be non-zero")
        if input.size(1) != self.num_features:
            raise ValueError(
                f"{type(self).__name__}({self.num_features}) got input of shape {tuple(input.shape)} "
                f"with {input.size(1)} channels in dim 1; build the layer with num_features={input.size(1)}"
            )

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Normalise `input` with group-wide batch statistics (training) or running statistics (eval)."""
        self._check_input_dim(input)
        self._check_channels(input)
        if getattr(self, "_is_replica", False):
            raise RuntimeError(
                f"{type(self).__name__} does not work inside nn.DataParallel (this module is a "
                "DataParallel replica): run one process per device with torchrun and wrap the model in "
                "torch.nn.parallel.DistributedDataParallel instead"
            )

        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            # Counted before the statistics, as _BatchNorm does; the cumulative average
            # (momentum=None) reads it on the device, so no host sync here.
            self.num_batches_tracked.add_(1)

        if not self.training:
            # Eval: running statistics (or, without buffers, this batch's own): never communicates.
            bn_training = self.running_mean is None and self.running_var is None
            return F.batch_norm(
                input, self.running_mean, self.running_var, self.weight, self.bias, bn_training, 0.0, self.eps
            )

        if self.eps <= 0.0:  # same check and words as F.batch_norm, which this path does not call
            raise ValueError(f"batch_norm eps must be positive during training, but got {self.eps}")
        track = self.track_running_stats
        running_mean = self.running_mean if track else None
        running_var = self.running_var if track else None
        num_batches_tracked = self.num_batches_tracked if track else None
        if self.momentum is not None:
            momentum = float(self.momentum)
        else:  # cumulative average: the kernel uses 1 / num_batches_tracked (negative = that mode)
            momentum = -1.0 if num_batches_tracked is not None else 0.0
        group_name, world_size = resolve_group(self.process_group)
        return sync_batch_norm(
            input, self.weight, self.bias, running_mean, running_var, num_batches_tracked,
            momentum, float(self.eps), group_name, world_size,
        )


class SyncBatchNorm1d(SyncBatchNorm):
    """SyncBatchNorm for (N, C) or (N, C, L) input, like nn.BatchNorm1d."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() != 2 and input.dim() != 3:
            raise ValueError(f"expected 2D or 3D input (got {input.dim()}D input)")


class SyncBatchNorm2d(SyncBatchNorm):
    """SyncBatchNorm for (N, C, H, W) input, like nn.BatchNorm2d."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() != 4:
            raise ValueError(f"expected 4D input (got {input.dim()}D input)")


class SyncBatchNorm3d(SyncBatchNorm):
    """SyncBatchNorm for (N, C, D, H, W) input, like nn.BatchNorm3d."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() != 5:
            raise ValueError(f"expected 5D input (got {input.dim()}D input)")
