"""One training epoch: forward, backward with accumulation, optimizer step, logging, step hooks.

Reads like the algorithm; the pieces it calls (accumulation windows, AMP, EMA, tracking) live in
their own modules.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch import nn

from src import dist
from src.engine.accumulation import gradient_sync, micro_step
from src.engine.amp import autocast
from src.engine.optim import current_lr
from src.logger import progress


@dataclass
class Progress:
    """Where training stands: the epoch in progress, optimizer steps done, next micro-batch of the epoch."""

    epoch: int = 0
    step: int = 0
    micro_batch: int = 0


@dataclass
class TrainParts:
    """Everything an epoch needs, built once by src.engine.train."""

    model: nn.Module  # DDP-wrapped when distributed
    loss_fn: Callable[[Any, torch.Tensor], torch.Tensor]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    device: torch.device
    accum_steps: int = 1
    amp: str = "none"
    channels_last: bool = False
    grad_clip_norm: Optional[float] = None
    ema: Optional[nn.Module] = None  # torch.optim.swa_utils.AveragedModel of the unwrapped model
    mix: Optional[Callable] = None  # MixUp / CutMix on a batch
    log_every: int = 20
    show_progress: bool = True
    # Called after every optimizer step with the progress; returns True to stop training now.
    after_step: Callable[[Progress], bool] = field(default=lambda progress: False)
    # Called with the reduced train metrics every log_every steps.
    log_metrics: Callable[[Progress, dict[str, float]], None] = field(default=lambda progress, metrics: None)
    # Called once with the first training batch (sample grid for TensorBoard).
    log_samples: Optional[Callable[[Progress, torch.Tensor, torch.Tensor], None]] = None


class _WindowMeter:
    """Loss and image counts since the last log line, kept on-device to avoid a sync per step."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.reset()

    def reset(self) -> None:
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        self.images = 0
        self.start = time.perf_counter()

    def add(self, loss: torch.Tensor, batch: int) -> None:
        self.loss_sum += loss.detach().double() * batch
        self.images += batch

    def reduced(self) -> dict[str, float]:
        """Global mean loss and global images/s over the window (a collective: every rank calls it)."""
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        sums = dist.reduce_dict({"loss_sum": float(self.loss_sum), "images": float(self.images)}, average=False)
        return {"loss": sums["loss_sum"] / max(sums["images"], 1.0), "throughput": sums["images"] / elapsed}


def train_one_epoch(parts: TrainParts, loader: Any, progress_state: Progress) -> bool:
    """Train from micro-batch `progress_state.micro_batch` to the end of the epoch; True if stopped early."""
    model, device = parts.model, parts.device
    model.train()
    num_micro_batches = len(loader)
    meter = _WindowMeter(device)
    bar = progress(loader, total=num_micro_batches - progress_state.micro_batch, enabled=parts.show_progress,
                   desc=f"epoch {progress_state.epoch}")
    for index, (images, targets) in enumerate(bar, start=progress_state.micro_batch):
        images = images.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        if parts.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        if parts.log_samples is not None:
            parts.log_samples(progress_state, images, targets)
            parts.log_samples = None
        if parts.mix is not None:
            images, targets = parts.mix(images, targets)

        micro = micro_step(index, num_micro_batches, parts.accum_steps)
        # Only the last micro-batch of a window all-reduces gradients (one all-reduce per optimizer step).
        with gradient_sync(model, micro.is_last_in_window):
            with autocast(parts.amp, device):
                outputs = model(images)
            loss = parts.loss_fn(outputs, targets)
            parts.scaler.scale(loss * micro.loss_scale).backward()
        meter.add(loss, images.shape[0])
        progress_state.micro_batch = index + 1
        if not micro.is_last_in_window:
            continue

        _optimizer_step(parts)
        progress_state.step += 1
        if progress_state.step % parts.log_every == 0:
            metrics = {**meter.reduced(), "lr": current_lr(parts.optimizer)}
            parts.log_metrics(progress_state, metrics)
            bar.set_postfix(loss=f"{metrics['loss']:.3f}", lr=f"{metrics['lr']:.3g}",
                            img_s=f"{metrics['throughput']:.0f}", refresh=False)
            meter.reset()
        if parts.after_step(progress_state):
            bar.close()
            return True
    bar.close()
    return False


def _optimizer_step(parts: TrainParts) -> None:
    """Clip (on unscaled gradients), step, update the loss scale, clear gradients, advance LR and EMA."""
    if parts.grad_clip_norm is not None:
        parts.scaler.unscale_(parts.optimizer)
        torch.nn.utils.clip_grad_norm_(parts.model.parameters(), parts.grad_clip_norm)
    parts.scaler.step(parts.optimizer)
    parts.scaler.update()
    parts.optimizer.zero_grad(set_to_none=True)
    parts.scheduler.step()
    if parts.ema is not None:
        parts.ema.update_parameters(_unwrap(parts.model))


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
