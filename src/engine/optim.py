"""Optimizer, LR-schedule and weight-EMA builders on top of torch.optim, torch.optim.lr_scheduler and
torch.optim.swa_utils.

Schedules are expressed in epochs in the config but stepped once per optimizer step here, so warmup
and decay are smooth and independent of how many steps an epoch has.
"""
from __future__ import annotations

import logging
from typing import Any, Iterable

import torch
from torch import nn
from torch.optim import lr_scheduler
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from src.models import param_groups

log = logging.getLogger(__name__)

# Devices whose fused SGD/AdamW kernels we rely on (torch checks only when stepping, too late for an error).
FUSED_DEVICE_TYPES = ("cpu", "cuda")


def effective_lr(optim_cfg: Any, effective_batch: int) -> float:
    """optim.lr, scaled by effective_batch / reference_batch_size when that is set (linear scaling rule)."""
    if optim_cfg.reference_batch_size:
        return optim_cfg.lr * effective_batch / optim_cfg.reference_batch_size
    return optim_cfg.lr


def describe_lr(optim_cfg: Any, effective_batch: int) -> str:
    """The lr a run uses and where it comes from, for the run's first lines: scaled or not, and by what."""
    lr = effective_lr(optim_cfg, effective_batch)
    head = f"; the head's x{optim_cfg.head_lr_mult:g}" if optim_cfg.head_lr_mult != 1 else ""
    if optim_cfg.reference_batch_size:
        how = ("the same batch: not scaled" if effective_batch == optim_cfg.reference_batch_size
               else f"scaled linearly by {effective_batch}/{optim_cfg.reference_batch_size}")
        reference = optim_cfg.reference_batch_size
        return (f"lr {lr:.6g} = optim.lr {optim_cfg.lr:g} for optim.reference_batch_size={reference} images, at an "
                f"effective batch of {effective_batch} ({how}){head}")
    return (f"lr {lr:.6g} = optim.lr, not scaled with the effective batch of {effective_batch} "
            f"(optim.reference_batch_size is null){head}")


def build_optimizer(model: nn.Module, optim_cfg: Any, effective_batch: int) -> torch.optim.Optimizer:
    """torch.optim.SGD or AdamW over param_groups(model); logs the lr it uses (describe_lr)."""
    lr = effective_lr(optim_cfg, effective_batch)
    log.info("%s", describe_lr(optim_cfg, effective_batch))
    # Backbone / head (head_lr_mult) x decay / no decay: norm weights and biases are not decayed, since
    # decaying BN scales pulls them to zero without regularising anything useful (Goyal et al. 2017).
    groups = param_groups(model, optim_cfg.head_lr_mult, weight_decay=optim_cfg.weight_decay,
                          no_decay_norm_bias=optim_cfg.exclude_bias_and_norm_from_weight_decay, base_lr=lr)
    if optim_cfg.name == "sgd":
        cls: type[torch.optim.Optimizer] = torch.optim.SGD
        kwargs: dict[str, Any] = {"momentum": optim_cfg.momentum, "nesterov": optim_cfg.nesterov}
    else:
        cls, kwargs = torch.optim.AdamW, {"betas": tuple(optim_cfg.betas), "eps": optim_cfg.eps}
    fused = optim_cfg.fused
    unfusable = sorted({f"{p.dtype} on {p.device.type}" for group in groups for p in group["params"]
                        if not (p.is_floating_point() and p.device.type in FUSED_DEVICE_TYPES)})
    if fused and unfusable:
        raise ValueError(f"optim.fused=true: the fused {cls.__name__} takes floating-point parameters on "
                         f"{' or '.join(FUSED_DEVICE_TYPES)}, this model has {', '.join(unfusable)}; "
                         "set optim.fused=null (fuse where possible) or false")
    if fused is None:
        # torch's default on CPU is a Python loop over the parameters: for DeepLabV3+-ResNet18 (12M
        # parameters, 1 thread) AdamW takes ~54 ms per step that way and ~9 ms fused, a sixth of a step.
        fused = not unfusable
    return cls(groups, lr=lr, fused=True, **kwargs) if fused else cls(groups, lr=lr, **kwargs)


def build_scheduler(optimizer: torch.optim.Optimizer, sched_cfg: Any, steps_per_epoch: int,
                    total_steps: int) -> lr_scheduler.LRScheduler:
    """Warmup (LinearLR) then cosine / step / poly, chained with SequentialLR; one .step() per optimizer step."""
    warmup = min(round(sched_cfg.warmup_epochs * steps_per_epoch), max(total_steps - 1, 0))
    decay_steps = max(total_steps - warmup, 1)
    if sched_cfg.name == "cosine":
        base = optimizer.param_groups[0]["initial_lr" if "initial_lr" in optimizer.param_groups[0] else "lr"]
        main: lr_scheduler.LRScheduler = lr_scheduler.CosineAnnealingLR(
            optimizer, T_max=decay_steps, eta_min=base * sched_cfg.min_lr_ratio)
    elif sched_cfg.name == "poly":
        main = lr_scheduler.PolynomialLR(optimizer, total_iters=decay_steps, power=sched_cfg.power)
    elif sched_cfg.milestones:
        # Milestones are epochs from the start of training; the main schedule starts after warmup.
        steps = [max(m * steps_per_epoch - warmup, 1) for m in sched_cfg.milestones]
        main = lr_scheduler.MultiStepLR(optimizer, milestones=steps, gamma=sched_cfg.gamma)
    else:
        main = lr_scheduler.StepLR(optimizer, step_size=max(sched_cfg.step_epochs * steps_per_epoch, 1),
                                   gamma=sched_cfg.gamma)
    if warmup == 0:
        return main
    ramp = lr_scheduler.LinearLR(optimizer, start_factor=sched_cfg.warmup_start_factor, total_iters=warmup)
    return lr_scheduler.SequentialLR(optimizer, schedulers=[ramp, main], milestones=[warmup])


def current_lr(optimizer: torch.optim.Optimizer) -> float:
    """The LR of the first (non-head) parameter group, for logging."""
    return float(optimizer.param_groups[0]["lr"])


def trainable(params: Iterable[nn.Parameter]) -> int:
    """Number of trainable scalars."""
    return sum(p.numel() for p in params if p.requires_grad)


def build_ema(model: nn.Module, decay: float) -> AveragedModel:
    """EMA copy of the unwrapped `model`; buffers (BN running stats) are averaged too (use_buffers=True)."""
    return AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)
