"""Norm-layer factory and whole-model conversion for norm=bn|syncbn|torch_syncbn|gn|frozen_bn."""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
from collections import Counter
from typing import Callable

import torch
from torch import nn

from src.models.config import NormConfig
from src.models.frozen_batchnorm import FrozenBatchNorm2d, freeze_batchnorm

log = logging.getLogger(__name__)

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


def adopt_norm(model: nn.Module, norm_cfg: NormConfig) -> nn.Module:
    """Give a zoo model (built with its own BatchNorm layers) norm_cfg's kind of norm; returns the new root.

    The layers keep their architecture's eps and momentum (e.g. 1e-3 / 0.01 in torchvision's MobileNetV3),
    which its weights files assume. bn, syncbn and torch_syncbn leave the layers as built (the synchronised
    kinds are converted by `finalize_norms`); frozen_bn freezes them in place, the same tensors; gn puts a
    GroupNorm (timm's GroupNormAct for timm's BatchNormAct2d) with the same weight and bias in each.
    """
    if norm_cfg.name == "frozen_bn":
        model, skipped = freeze_batchnorm(model)
        if skipped:
            log.warning("norm=frozen_bn: %d BatchNorm layer(s) that are not BatchNorm2d with running statistics "
                        "stay as they are: %s", len(skipped), ", ".join(skipped))
    elif norm_cfg.name == "gn":
        model = batchnorm_to_groupnorm(model, norm_cfg.num_groups, norm_cfg.eps)
    return model


def batchnorm_to_groupnorm(model: nn.Module, num_groups: int, eps: float) -> nn.Module:
    """Replace every nn.BatchNorm2d / timm BatchNormAct2d by GroupNorm(num_groups) with the same weight and bias.

    ValueError (before anything is replaced) when num_groups does not divide a layer's channels, naming
    the layers and the largest group count that fits every one of them.
    """
    targets = [(name, m) for name, m in model.named_modules() if type(m) is nn.BatchNorm2d or _is_timm_norm_act(m)]
    bad = [(name, m.num_features) for name, m in targets if m.num_features % num_groups]
    if bad:
        common = math.gcd(*(m.num_features for _, m in targets))
        fit = max(d for d in range(1, min(common, 32) + 1) if common % d == 0)
        listing = ", ".join(f"{name} ({c} channels)" for name, c in bad[:5])
        raise ValueError(f"norm.num_groups={num_groups} does not divide the channels of {len(bad)} norm layer(s) of "
                         f"this model: {listing}{', ...' if len(bad) > 5 else ''}; norm.num_groups={fit} divides "
                         "every one of them")

    def group_norm(bn: nn.Module) -> nn.Module:
        if _is_timm_norm_act(bn):
            from timm.layers import GroupNormAct  # the model is a timm model: timm is imported already

            gn: nn.Module = GroupNormAct(bn.num_features, num_groups, eps=eps, affine=bn.affine, apply_act=False)
            gn.drop, gn.act = bn.drop, bn.act
        else:
            gn = nn.GroupNorm(num_groups, bn.num_features, eps=eps, affine=bn.affine)
        if bn.affine:  # the architecture's own init (e.g. zero-init of a residual branch's last norm)
            gn.weight, gn.bias = bn.weight, bn.bias
        return gn.train(bn.training)

    if not targets:
        return model
    if targets[0][0] == "":
        return group_norm(model)
    for name, bn in targets:
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, group_norm(bn))
    return model


def _is_timm_norm_act(module: nn.Module) -> bool:
    """True for timm.layers.BatchNormAct2d exactly (its subclasses may do something else)."""
    norm_act = sys.modules.get("timm.layers.norm_act")
    return norm_act is not None and type(module) is getattr(norm_act, "BatchNormAct2d", None)


def finalize_norms(model: nn.Module, norm_cfg: NormConfig) -> nn.Module:
    """Convert BatchNorm layers to the synchronised kind for syncbn / torch_syncbn (with syncbn's group and
    modes); freeze affine parameters if asked."""
    if norm_cfg.name == "syncbn":
        try:
            from src.syncbn import configure_sync, convert_sync_batchnorm
        except ImportError as err:  # the package is built by another part of the project
            raise RuntimeError(f"norm=syncbn needs src.syncbn.convert_sync_batchnorm, which failed to import "
                               f"({err}); use norm=bn until src/syncbn is installed") from err
        # process_group=None: the layers resolve WORLD (or their group_size group) at forward time.
        model = convert_sync_batchnorm(model)
        configure_sync(model, group_size=norm_cfg.group_size, sync_every=norm_cfg.sync_every,
                       sync_until_step=norm_cfg.sync_until_step)
    elif norm_cfg.name == "torch_syncbn":
        if any(_is_timm_norm_act(m) for m in model.modules()):
            # torch's converter would turn timm's BatchNormAct2d into a plain SyncBatchNorm without its
            # activation; timm's own converter keeps it (SyncBatchNormAct).
            from timm.layers import convert_sync_batchnorm as timm_convert_sync_batchnorm

            model = timm_convert_sync_batchnorm(model)
        else:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if not norm_cfg.affine_trainable:
        for module in model.modules():
            if isinstance(module, NORM_TYPES):
                for param in module.parameters(recurse=False):
                    param.requires_grad_(False)
    return model


def checked_cuda_syncbn(model: nn.Module, norm_cfg: NormConfig, device: torch.device) -> nn.Module:
    """norm=syncbn: load our kernels now (their first use on a machine compiles them, and says so), not in the
    first training step, whose time the progress bar would count; on a GPU, self-check the CUDA kernels there
    first (norm.cuda_selfcheck). Returns the model, or, after a failed check with cuda_selfcheck=fallback, the
    same model with torch's nn.SyncBatchNorm (same Parameter and buffer objects). Other norms: unchanged."""
    if norm_cfg.name != "syncbn":
        return model
    from src.syncbn.functions import kernel_ops

    kernel_ops()
    if device.type != "cuda":
        return model
    from src.syncbn import revert_sync_batchnorm
    from src.syncbn.selfcheck import ensure_cuda_kernels_checked

    if ensure_cuda_kernels_checked(device, norm_cfg.cuda_selfcheck):
        return model
    fallback = dataclasses.replace(norm_cfg, name="torch_syncbn")
    return finalize_norms(revert_sync_batchnorm(model), fallback)


def count_norm_layers(model: nn.Module) -> dict[str, int]:
    """Number of normalisation layers per class name, e.g. {"SyncBatchNorm2d": 53} (for health checks/logs)."""
    return dict(Counter(type(m).__name__ for m in model.modules() if isinstance(m, NORM_TYPES)))
