"""BatchNorm that always normalises with its running statistics ("use global stats" in training)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class FrozenBatchNorm2d(nn.Module):
    """y = (x - running_mean) / sqrt(running_var + eps) * weight + bias, in training as in eval.

    Hand-written rather than torchvision.ops.FrozenBatchNorm2d because that one stores weight and bias as
    buffers (no gradient) and drops `num_batches_tracked`; ours keeps trainable affine parameters and exactly
    nn.BatchNorm2d's state_dict keys, so checkpoints move between norm=bn, syncbn and frozen_bn.
    Deliberately not a `_BatchNorm` subclass: convert_sync_batchnorm (ours or PyTorch's) would otherwise
    turn it into a SyncBatchNorm and silently unfreeze its statistics.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine_trainable: bool = True) -> None:
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum  # kept for reprs / conversions; the statistics never update
        self.weight = nn.Parameter(torch.ones(num_features), requires_grad=affine_trainable)
        self.bias = nn.Parameter(torch.zeros(num_features), requires_grad=affine_trainable)
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise with the running statistics; gradients reach x, weight and bias."""
        if x.dim() != 4:
            raise ValueError(f"FrozenBatchNorm2d expects 4-D input (N, C, H, W), got {x.dim()}-D")
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                            training=False, momentum=0.0, eps=self.eps)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        # Old BatchNorm checkpoints (version < 2) lack num_batches_tracked; accept them as nn.BatchNorm2d does.
        state_dict.setdefault(prefix + "num_batches_tracked", torch.tensor(0, dtype=torch.long))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}"
