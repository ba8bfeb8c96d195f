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


class FrozenBatchNormAct2d(FrozenBatchNorm2d):
    """FrozenBatchNorm2d -> drop -> act: the frozen form of timm's BatchNormAct2d, with its state_dict keys.

    timm's own FrozenBatchNormAct2d stores weight and bias as buffers and drops num_batches_tracked; this
    one keeps them trainable and the keys identical, like FrozenBatchNorm2d above.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine_trainable: bool = True, *, act: nn.Module | None = None,
                 drop: nn.Module | None = None) -> None:
        super().__init__(num_features, eps, momentum, affine_trainable)
        self.drop = drop if drop is not None else nn.Identity()  # BatchNormAct2d's order: drop, then act
        self.act = act if act is not None else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise with the running statistics, then drop, then the activation."""
        return self.act(self.drop(super().forward(x)))


def freeze_batchnorm(module: nn.Module) -> tuple[nn.Module, list[str]]:
    """Turn every nn.BatchNorm2d (and timm BatchNormAct2d) into its frozen form, keeping the same tensors.

    Returns the (possibly new) root and the names of BatchNorm layers that could not be frozen: other
    classes (1d/3d, subclasses) and layers without running statistics (track_running_stats=False).
    """
    skipped: list[str] = []

    def convert(m: nn.Module, name: str) -> nn.Module:
        norm_act = type(m).__name__ == "BatchNormAct2d" and type(m).__module__.startswith("timm.")
        if type(m) is nn.BatchNorm2d or norm_act:
            if m.running_mean is None:
                skipped.append(name or "<root>")
                return m
            parts = {"act": m.act, "drop": m.drop} if norm_act else {}
            frozen = (FrozenBatchNormAct2d if norm_act else FrozenBatchNorm2d)(
                m.num_features, m.eps, m.momentum, **parts)
            frozen.weight, frozen.bias = m.weight, m.bias  # the same Parameters (None when affine=False)
            for key in ("running_mean", "running_var", "num_batches_tracked"):
                frozen._buffers[key] = m._buffers[key]
            frozen.train(m.training)
            return frozen
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            skipped.append(name or "<root>")
            return m
        for child_name, child in m.named_children():
            new = convert(child, f"{name}.{child_name}" if name else child_name)
            if new is not child:
                setattr(m, child_name, new)
        return m

    return convert(module, ""), skipped
