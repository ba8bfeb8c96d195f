"""Norm-layer factory and whole-model conversion for norm=bn|syncbn|torch_syncbn|gn|frozen_bn."""

from __future__ import annotations

from collections import Counter
from typing import Callable

from torch import nn

from src.models.config import NormConfig
from src.models.frozen_batchnorm import FrozenBatchNorm2d

NormLayer = Callable[[int], nn.Module]

# Module types that count as normalisation layers (for health checks and weight-decay exclusion).
NORM_TYPES: tuple[type[nn.Module], ...] = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm,
                                           nn.modules.instancenorm._InstanceNorm, FrozenBatchNorm2d)


def norm_layer_factory(norm_cfg: NormConfig) -> NormLayer:
    """Constructor injected as `norm_layer` (C -> module). Sync variants build nn.BatchNorm2d here and are
    converted afterwards by `finalize_norms`, as PyTorch recommends for nn.SyncBatchNorm."""
    name, eps, momentum = norm_cfg.name, norm_cfg.eps, norm_cfg.momentum
    if name in ("bn", "syncbn", "torch_syncbn"):
        return lambda c: nn.BatchNorm2d(c, eps=eps, momentum=momentum)
    if name == "frozen_bn":
        return lambda c: FrozenBatchNorm2d(c, eps=eps, momentum=momentum)
    if name == "gn":
        groups = norm_cfg.num_groups

        def group_norm(c: int) -> nn.Module:
            if c % groups:
                raise ValueError(f"norm.num_groups={groups} does not divide a norm layer's {c} channels; choose "
                                 f"a divisor of every channel count (norm.num_groups=16 fits all models here)")
            return nn.GroupNorm(groups, c, eps=eps)

        return group_norm
    raise ValueError(f"norm.name must be one of bn, syncbn, torch_syncbn, gn, frozen_bn; got {name!r}")


def replace_batchnorm2d(module: nn.Module, norm_layer: NormLayer) -> nn.Module:
    """Replace every plain nn.BatchNorm2d (e.g. inside torchvision's segmentation heads, which hard-code it)
    with norm_layer(num_features); returns the (possibly new) root."""
    if type(module) is nn.BatchNorm2d:  # exact type: never touch converted or subclassed layers
        return norm_layer(module.num_features)
    for child_name, child in module.named_children():
        new_child = replace_batchnorm2d(child, norm_layer)
        if new_child is not child:
            setattr(module, child_name, new_child)
    return module


def finalize_norms(model: nn.Module, norm_cfg: NormConfig) -> nn.Module:
    """Convert BatchNorm layers to the synchronised kind for syncbn / torch_syncbn; freeze affine if asked."""
    if norm_cfg.name == "syncbn":
        try:
            from src.syncbn import convert_sync_batchnorm
        except ImportError as err:  # the package is built by another part of the project
            raise RuntimeError(f"norm=syncbn needs src.syncbn.convert_sync_batchnorm, which failed to import "
                               f"({err}); use norm=bn until src/syncbn is installed") from err
        # process_group=None: the layers resolve WORLD at forward time, after init_distributed.
        model = convert_sync_batchnorm(model)
    elif norm_cfg.name == "torch_syncbn":
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if not norm_cfg.affine_trainable:
        for module in model.modules():
            if isinstance(module, NORM_TYPES):
                for param in module.parameters(recurse=False):
                    param.requires_grad_(False)
    return model


def count_norm_layers(model: nn.Module) -> dict[str, int]:
    """Number of normalisation layers per class name, e.g. {"SyncBatchNorm2d": 53} (for health checks/logs)."""
    return dict(Counter(type(m).__name__ for m in model.modules() if isinstance(m, NORM_TYPES)))
