"""PreciseBNHook: when trainer.precise_bn_batches > 0, recompute the BatchNorm statistics of the model (and of its
EMA) before the evaluation at the end of training and, with trainer.precise_bn_every=k, before every k-th
scheduled evaluation. The maths is src/engine/precise_bn.py.

Batches: the first `precise_bn_batches` micro-batches of the training loader in the order of the epoch just
trained, with its augmentation (continuing into the next epochs' orders when an epoch has fewer). Every rank's
TrainBatchSampler yields the same number of equally sized micro-batches, so every rank makes the same forwards;
MixUp / CutMix are not applied (they make images no evaluation sees). Inputs are cast and laid out as the
training loop does (trainer.dtype, channels_last) and run under its autocast (trainer.amp), through the
unwrapped model, eagerly: neither DDP nor a torch.compile'd module is involved. The RNG state is saved and
restored around the passes, so the rest of the run (dropout, MixUp, the loader's seeds) is what it would have
been without them.
"""
from __future__ import annotations

import logging
from typing import Any, Iterator

import torch
from torch import nn

from src import comm
from src.config import TrainerConfig
from src.data import set_loader_epoch
from src.data.batch import Batch
from src.engine.hooks import Hook, TrainerView
from src.engine.precise_bn import recompute_bn_stats
from src.precision import PRECISIONS, autocast

log = logging.getLogger(__name__)


class PreciseBNHook(Hook):
    """Recalibrates BN statistics in after_epoch, before EvalHook evaluates (it must come first in the list)."""

    def __init__(self, settings: TrainerConfig, device: torch.device) -> None:
        self.num_batches, self.every, self.eval_every = (settings.precise_bn_batches, settings.precise_bn_every,
                                                         settings.eval_every)
        self.device, self.dtype = device, PRECISIONS[settings.dtype]
        self.amp, self.channels_last = settings.amp, settings.channels_last
        self._transform: Any = None  # the trainer's device_transform (data.device_transforms), read per pass

    def due(self, trainer: TrainerView) -> bool:
        """At the end of training, or at every `every`-th evaluation EvalHook makes (epochs eval_every x every)."""
        if trainer.finishing:
            return True
        return bool(self.every) and trainer.epoch_complete and (trainer.epoch + 1) % (self.eval_every * self.every) == 0

    def after_epoch(self, trainer: TrainerView) -> None:
        """Recompute the statistics of the model and its EMA when due (a collective)."""
        if not self.due(trainer):
            return
        state = trainer.state
        models: list[nn.Module] = [state.model] + ([state.ema.module] if state.ema is not None else [])
        images = [0]
        self._transform = getattr(trainer, "device_transform", None)  # data.device_transforms: uint8 batches

        def forward(model: nn.Module, batch: torch.Tensor) -> None:
            with autocast(self.amp, self.device):
                model(batch)

        cuda = [self.device.index or 0] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda):
            reports = recompute_bn_stats(models, _EpochPasses(trainer.loader, trainer.epoch, self._to_device, images),
                                         self.num_batches, forward)
        total = int(comm.reduce_dict({"images": float(images[0])}, average=False)["images"])
        if comm.is_main_process():
            done = "; ".join(
                f"{name}: {r.layers} BatchNorm layer(s) recomputed ({r.values} values per channel in the first)"
                + (f", {len(r.skipped)} left as they were (fewer than 2 values): {', '.join(r.skipped)}"
                   if r.skipped else "")
                for name, r in zip(("model", "EMA"), reports))
            log.info("precise BN at step %d (%.1fs): %d training batch(es) per process x %d process(es) = %d images; %s",
                     state.progress.step, reports[0].seconds, self.num_batches, comm.get_world_size(), total, done)

    def _to_device(self, batch: Batch) -> torch.Tensor:
        batch = batch.to(self.device, self.dtype, transform=self._transform)
        return (batch.channels_last() if self.channels_last else batch).images


class _EpochPasses:
    """The training loader's images, one epoch's order per iteration: `epoch`, then epoch + 1, ...
    (recompute_bn_stats iterates again when it needs more batches than one epoch has)."""

    def __init__(self, loader: Any, epoch: int, to_device: Any, images: list[int]) -> None:
        self.loader, self.epoch, self.to_device, self.images = loader, epoch, to_device, images

    def __iter__(self) -> Iterator[torch.Tensor]:
        set_loader_epoch(self.loader, self.epoch)
        self.loader.batch_sampler.set_start(0)
        self.epoch += 1
        for batch in self.loader:
            self.images[0] += batch.size
            yield self.to_device(batch)
