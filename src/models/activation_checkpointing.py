"""trainer.activation_checkpointing: recompute each stage's activations in the backward instead of keeping them.

Which regions is the model family's to say (its registration's `checkpoint_stages`, src/models/registry.py): our
ResNets' stages (layer1..layer3 / layer1..layer4, also torchvision's ResNet family from `model=torchvision`) and
DeepLab's backbone stages through `resnet_stages` here, timm's own `set_grad_checkpointing` for timm models
(src/models/zoo.py). Every region runs through `torch.utils.checkpoint.checkpoint(use_reentrant=False)`, which is
what lets BatchNorm layers see their recomputation (src/syncbn/recompute.py): SyncBatchNorm reuses the first
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


def resnet_stages(owner: nn.Module, prefix: str = "") -> list[str]:
    """Checkpoint the ResNet stages layer1..layer4 that are children of `owner` (a ResNet, or a model's ResNet
    trunk with `prefix` naming where it is, e.g. "backbone."); returns their names. ValueError naming the key when
    `owner` has none."""
    regions = []
    for name in STAGE_NAMES:
        stage = getattr(owner, name, None)
        if isinstance(stage, nn.Module):
            checkpoint_module(stage)
            regions.append(prefix + name)
    if not regions:
        raise ValueError(f"trainer.activation_checkpointing=true: {type(owner).__name__} has no ResNet stages "
                         f"({', '.join(STAGE_NAMES)}) to checkpoint; set trainer.activation_checkpointing=false")
    return regions


def enable_activation_checkpointing(model: nn.Module, family: Any) -> list[str]:
    """Checkpoint `model`'s regions as its ModelFamily says (`checkpoint_stages`); returns the regions' names.

    ValueError, naming the key, for a family whose stages are not known.
    """
    from src.syncbn.torch_bn_recompute import guard_batchnorm_recompute

    if family.checkpoint_stages is None:
        raise ValueError(f"trainer.activation_checkpointing=true: the stages of {family.name} models are not known "
                         "to the trainer; set trainer.activation_checkpointing=false")
    regions = family.checkpoint_stages(model)
    guard_batchnorm_recompute(model)
    return regions
