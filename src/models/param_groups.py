"""Optimizer parameter groups: backbone vs heads (head LR multiplier) and no weight decay on norms/biases."""

from __future__ import annotations

from typing import Any, Optional

from torch import nn

from src.models.norms import NORM_TYPES
from src.unwrap import unwrap_model


def head_module_names(model: nn.Module) -> tuple[str, ...]:
    """A classifier's head modules: `model.head_module_names` when its builder set it (timm and torchvision
    models: `fc`, `classifier`, `head.fc`, ...), else the in-repo classifiers' `fc`."""
    return tuple(getattr(model, "head_module_names", ("fc",)))


def is_head_parameter(model: nn.Module, name: str) -> bool:
    """Heads: everything outside `model.backbone` for segmentation models, the classifier's head modules
    (`head_module_names`) for classifiers."""
    if isinstance(getattr(model, "backbone", None), nn.Module):
        return not name.startswith("backbone.")
    return name.startswith(tuple(f"{head}." for head in head_module_names(model)))


def no_decay_parameter_names(model: nn.Module) -> set[str]:
    """Names of the parameters of normalisation layers and of every bias (the usual no-weight-decay set)."""
    model = unwrap_model(model)
    names = set()
    for module_name, module in model.named_modules():
        for param_name, _ in module.named_parameters(recurse=False):
            if isinstance(module, NORM_TYPES) or param_name == "bias":
                names.add(f"{module_name}.{param_name}" if module_name else param_name)
    return names


def param_groups(model: nn.Module, head_lr_mult: float = 1.0, *, weight_decay: float = 0.0,
                 no_decay_norm_bias: bool = False, base_lr: Optional[float] = None) -> list[dict[str, Any]]:
    """Parameter groups for torch.optim: {"name", "params", "lr_mult", "weight_decay"[, "lr"]} per group.

    Groups: backbone / head (lr_mult 1 / head_lr_mult), each split into decay / no_decay when
    no_decay_norm_bias (norm weights+biases and all biases get weight_decay 0). Empty groups are left out;
    parameters with requires_grad=False are left out. With base_lr, each group also gets lr = base_lr * lr_mult
    (schedulers scale each group's initial lr, so the ratio is kept).
    """
    if head_lr_mult <= 0:
        raise ValueError(f"head_lr_mult must be > 0, got {head_lr_mult}")
    model = unwrap_model(model)
    no_decay = no_decay_parameter_names(model) if no_decay_norm_bias else set()
    buckets: dict[tuple[str, bool], list[nn.Parameter]] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        part = "head" if is_head_parameter(model, name) else "backbone"
        buckets.setdefault((part, name in no_decay), []).append(param)
    groups = []
    for part in ("backbone", "head"):
        for skip_decay in (False, True):
            params = buckets.get((part, skip_decay))
            if not params:
                continue
            group: dict[str, Any] = {
                "name": part + ("_no_decay" if skip_decay else ""),
                "params": params,
                "lr_mult": head_lr_mult if part == "head" else 1.0,
                "weight_decay": 0.0 if skip_decay else weight_decay,
            }
            if base_lr is not None:
                group["lr"] = base_lr * group["lr_mult"]
            groups.append(group)
    return groups
