"""trainer.activation_checkpointing: recompute each stage's activations in the backward instead of keeping them.

Which regions: our ResNets' stages (layer1..layer3 / layer1..layer4, also torchvision's ResNet family from
`model=torchvision`), DeepLab's backbone stages, and for timm models timm's own `set_grad_checkpointing`.
Every region runs through `torch.utils.checkpoint.checkpoint(use_reentrant=False)`, which is what lets
BatchNorm layers see their recomputation (src/syncbn/recompute.py): SyncBatchNorm reuses the first
forward's global statistics (no second collective, no second running-statistics update) and torch's own
BatchNorm layers skip the second update. Parameter and module names, and so state_dict keys, are unchanged:
a stage keeps its class and children; only its instance `forward` is replaced.
"""
from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torchvision.models import resnet as tv_resnet
from torchvision.models._utils import IntermediateLayerGetter

from src.models.cifar_resnet import CifarResNet

STAGE_NAMES = ("layer1", "layer2", "layer3", "layer4")


def _checkpointed_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The class's forward, under a non-reentrant checkpoint when training with autograd on."""
    forward = type(self).forward.__get__(self)
    if not (self.training and torch.is_grad_enabled()):
        return forward(*args, **kwargs)  # evaluation keeps no activations anyway: nothing to save
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def checkpoint_module(module: nn.Module) -> None:
    """Run `module`'s forward under activation checkpointing (an instance-level forward; deepcopy rebinds it)."""
    module.forward = types.MethodType(_checkpointed_forward, module)


def _stage_owner(model: nn.Module) -> nn.Module | None:
    """The module whose layer1..layer4 children are the stages to checkpoint, or None for an unknown layout."""
    if isinstance(model, (CifarResNet, tv_resnet.ResNet)):
        return model
    backbone = getattr(model, "backbone", None)
    if isinstance(backbone, IntermediateLayerGetter):  # our DeepLabV3 / DeepLabV3+: a ResNet trunk
        return backbone
    return None


def _enable_timm(model: nn.Module) -> list[str]:
    from timm.layers import use_reentrant_ckpt

    if use_reentrant_ckpt():
        raise ValueError("trainer.activation_checkpointing=true needs timm's non-reentrant checkpoints, but timm is "
                         "set to reentrant ones (TIMM_REENTRANT_CKPT or timm.layers.set_reentrant_ckpt); unset it")
    try:
        model.set_grad_checkpointing(True)
    except (AssertionError, NotImplementedError) as err:
        raise ValueError(f"trainer.activation_checkpointing=true: timm's {type(model).__name__} does not support "
                         f"gradient checkpointing ({err or 'set_grad_checkpointing refused'}); "
                         "set trainer.activation_checkpointing=false") from err
    return ["(timm set_grad_checkpointing)"]


def enable_activation_checkpointing(model: nn.Module, family: str) -> list[str]:
    """Checkpoint `model`'s stages (timm: its own checkpointing); returns the checkpointed regions' names.

    `family` is the model registry's family ("cifar_resnet", "resnet", "deeplabv3", "deeplabv3plus",
    "timm", "torchvision"). ValueError, naming the key, for a model whose stages are not known.
    """
    from src.syncbn.torch_bn_recompute import guard_batchnorm_recompute

    if family == "timm":
        regions = _enable_timm(model)
    else:
        owner = _stage_owner(model)
        if owner is None:
            raise ValueError(
                f"trainer.activation_checkpointing=true: the stages of {type(model).__name__} ({family}) are not "
                "known; it is supported for our ResNets and DeepLab models, torchvision's ResNet family "
                "(resnet*, resnext*, wide_resnet*) and timm models; set trainer.activation_checkpointing=false"
            )
        prefix = "backbone." if owner is not model else ""
        regions = []
        for name in STAGE_NAMES:
            stage = getattr(owner, name, None)
            if stage is not None:
                checkpoint_module(stage)
                regions.append(prefix + name)
    guard_batchnorm_recompute(model)
    return regions
