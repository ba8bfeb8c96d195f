"""Trainer: the training loop (epochs, micro-batches, accumulation, AMP, optimizer step) and its hooks.

Who owns what:
- `trainer.state` (TrainState): the unwrapped model, optimizer, scheduler, scaler, EMA, progress,
  best-k list, config; its state_dict() is the checkpoint.
- `trainer.module`: what the forward pass goes through: the model, wrapped in DDP when distributed
  (src/engine/wrap.py; with trainer.compile, src/engine/compile.py compiles around the DDP module).
- `trainer.eval_module`: what evaluation runs (default: the unwrapped model).
- hooks (src/engine/hooks.py): logging, evaluation, checkpoints, stopping; the loop calls them.

The loop itself only trains: one epoch is a pass over the loader from the resume position; every K
micro-batches (an accumulation window, src/engine/accumulation.py) end in an optimizer step, after
which the hooks run. See src/engine/hooks.py for the hook protocol and how a hook stops the run or
forces a checkpoint.
"""
from __future__ import annotations

import logging
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
from torch import nn

from src import comm
from src.config import TrainerConfig
from src.data import set_loader_epoch
from src.data.batch import Batch
from src.data.device_transforms import DeviceTransform, prefetch
from src.engine.accumulation import gradient_sync, micro_step
from src.engine.checkpoint.files import CheckpointSaver
from src.engine.checkpoint.state import TrainState
from src.engine.finite import FiniteGuard
from src.engine.hooks import Hook, StepOutput
from src.engine.norm_sync import sync_bn_buffers
from src.engine.optim import current_lr
from src.logger import progress
from src.precision import PRECISIONS, autocast
from src.tasks import Task

log = logging.getLogger(__name__)


class Trainer:
    """Runs TrainState through epochs of `loader`; hooks do everything around the optimizer steps."""

    def __init__(self, state: TrainState, module: nn.Module, loader: Any, loss_fn: Callable[[Any, torch.Tensor],
                 torch.Tensor], settings: TrainerConfig, device: torch.device, *, hooks: Sequence[Hook] = (),
                 saver: Optional[CheckpointSaver] = None, mix: Optional[Callable] = None,
                 eval_module: Optional[nn.Module] = None, buffer_sync: str = "none",
                 device_transform: Optional[DeviceTransform] = None, task: Optional[Task] = None) -> None:
        self.state, self.module, self.loader, self.loss_fn = state, module, loader, loss_fn
        self.settings, self.device, self.saver, self.mix = settings, device, saver, mix
        self.dtype = PRECISIONS[settings.dtype]  # inputs are cast to it, like the model's weights
        self.hooks = list(hooks)
        self.eval_module = eval_module if eval_module is not None else state.model
        self.buffer_sync = buffer_sync  # reduce | broadcast | none: per-rank BN statistics before eval/checkpoint
        self.device_transform = device_transform  # data.device_transforms: uint8 batches finished on the device
        # How batches go through the model (src/tasks/); the default: a model of stacked images.
        self.task = task if task is not None else Task()
        self.epoch = state.progress.epoch  # the epoch being trained (or, in after_epoch, just trained)
        self.epoch_complete = False
        self.finishing = False
        self.last_step: Optional[StepOutput] = None
        self.batch: Optional[Batch] = None  # the last micro-batch (on the device), before MixUp
        self.stop_reason: Optional[str] = None
        self.exit_code: Optional[int] = None
        self._checkpoint_requested = False
        # fp16's GradScaler skips non-finite steps by design: those alone do not stop the run.
        self.guard = FiniteGuard(device, skipped_steps_allowed=state.scaler.is_enabled(), model=state.model)
        self._bar: Any = None
        self.started = time.perf_counter()

    # --- control, for hooks ---------------------------------------------------------------------------
    def request_stop(self, reason: str, exit_code: Optional[int] = None) -> None:
        """End training after the current step; with `exit_code`, as an interruption (see hooks.py)."""
        if self.stop_reason is None:
            self.stop_reason, self.exit_code = reason, exit_code
            log.info("stopping after step %d: %s", self.state.progress.step, reason)

    def request_checkpoint(self) -> None:
        """Write last.pt once the current step's hooks have run."""
        self._checkpoint_requested = True

    @property
    def interrupted(self) -> bool:
        """True when a stop with an exit code was requested."""
        return self.exit_code is not None

    def show(self, **fields: str) -> None:
        """Put short values (loss, lr, ...) on rank 0's progress bar."""
        if self._bar is not None:
            self._bar.set_postfix(refresh=False, **fields)

    # --- services, for hooks --------------------------------------------------------------------------
    def sync_buffers(self) -> None:
        """Make per-rank BN statistics (model and EMA) equal on all ranks (a collective; no-op when not needed)."""
        sync_bn_buffers(self.state.model, self.buffer_sync)
        if self.state.ema is not None:
            sync_bn_buffers(self.state.ema.module, self.buffer_sync)

    def check_finite(self, where: str) -> None:
        """Raise NonFiniteError on every rank if a loss, gradient norm or weight went non-finite (a collective).

        Weights means everything a checkpoint stores: parameters and float buffers (BN statistics), EMA's too.
        """
        modules = {"": self.state.model, "ema.": self.state.ema}
        tensors = {prefix + name: t for prefix, m in modules.items() if m is not None
                   for name, t in (*m.named_parameters(), *m.named_buffers()) if t.is_floating_point()}
        self.guard.check(tensors, where, f"lr now {current_lr(self.state.optimizer):.4g}, "
                                         f"trainer.amp={self.settings.amp}, trainer.dtype={self.settings.dtype}")

    def save_checkpoint(self) -> Optional[Path]:
        """Write last.pt (and a best-k file when the current weights were evaluated). A collective.

        Never writes non-finite weights: the finiteness check comes first.
        """
        self.check_finite(f"before the checkpoint at step {self.state.progress.step}")
        self.sync_buffers()
        state = self.state
        best_name, dropped = None, []
        if state.metrics and self.saver is not None:
            state.best, best_name, dropped = self.saver.best_k_update(state.best, state.progress.step, state.metrics)
        data = state.state_dict()  # collective (RNG states of every rank)
        path = None
        if comm.is_main_process() and self.saver is not None:
            path = self.saver.write(data, best_name, dropped)
        comm.barrier()  # nobody runs ahead of a checkpoint a restarted job would resume from
        return path

    # --- the loop -------------------------------------------------------------------------------------
    def train(self) -> None:
        """before_train, then epochs until the configured end or a stop request, then after_train.

        after_train runs however the loop ends, also when it raises (a non-finite loss, a collective's
        timeout): hooks put back what before_train changed, e.g. PreemptionHook's signal handlers.
        """
        try:
            self._call("before_train")
            while self.stop_reason is None and self.state.progress.epoch < self.settings.epochs:
                self.epoch = self.state.progress.epoch
                self._run_epoch()
                if self.interrupted:
                    break
                self.finishing = self.stop_reason is not None or self.state.progress.epoch >= self.settings.epochs
                self.check_finite(f"after epoch {self.epoch}")  # before evaluating or saving the weights
                self._call("after_epoch")
        finally:
            self._call("after_train")

    def _run_epoch(self) -> None:
        """Micro-batches from the resume position to the end of the epoch, or until a stop request."""
        p = self.state.progress
        num_micro_batches = len(self.loader)
        if p.micro_batch < num_micro_batches:
            set_loader_epoch(self.loader, p.epoch)
            self.loader.batch_sampler.set_start(p.micro_batch)
            self.module.train()
            self._bar = progress(self.loader, total=num_micro_batches - p.micro_batch,
                                 enabled=self.settings.progress_bar and comm.is_main_process(),
                                 desc=f"epoch {p.epoch}")
            try:
                self._micro_batches(num_micro_batches)
            finally:
                self._bar.close()
                self._bar = None
        self.epoch_complete = p.micro_batch >= num_micro_batches
        if self.epoch_complete:
            p.epoch, p.micro_batch = p.epoch + 1, 0

    def _micro_batches(self, num_micro_batches: int) -> None:
        p = self.state.progress
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        images_seen, data_seconds = 0, 0.0
        started = waited = time.perf_counter()
        move = partial(Batch.to, device=self.device, dtype=self.dtype, transform=self.device_transform)
        # With device transforms, the next batch's copy runs on a side CUDA stream during this step (decoding on
        # the device: on a producer thread).
        batches = (prefetch(self._bar, move, self.device, threaded=self.device_transform.decoder is not None)
                   if self.device_transform is not None else (move(batch) for batch in self._bar))
        for index, batch in enumerate(batches, start=p.micro_batch):
            data_seconds += time.perf_counter() - waited
            batch = self._keep(batch)
            micro = micro_step(index, num_micro_batches, self.settings.grad_accum_steps)
            loss = self._forward_backward(batch.images, batch.targets, micro.loss_scale, micro.is_last_in_window)
            size = batch.size
            loss_sum += loss.detach().double() * size
            images_seen += size
            p.micro_batch = index + 1
            if micro.is_last_in_window:
                grad_norm = self._optimizer_step()
                p.step += 1
                self.guard.observe(p.step, loss_sum, grad_norm)
                self.last_step = StepOutput(loss_sum, images_seen, time.perf_counter() - started, data_seconds)
                self._after_step()
                if self.stop_reason is not None:
                    return
                loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
                images_seen, data_seconds = 0, 0.0
                started = time.perf_counter()
            waited = time.perf_counter()

    def _keep(self, batch: Batch) -> Batch:
        """A batch on the device: memory format, kept as self.batch."""
        if self.settings.channels_last:
            batch = batch.channels_last()
        self.batch = batch
        return batch

    def _forward_backward(self, images: torch.Tensor, targets: torch.Tensor, loss_scale: float,
                          sync: bool) -> torch.Tensor:
        """One micro-batch; only the last of a window all-reduces gradients (one all-reduce per step)."""
        if self.mix is not None:
            images, targets = self.mix(images, targets)
        with gradient_sync(self.module, sync):
            with autocast(self.settings.amp, self.device):
                outputs = self.task.forward(self.module, images, targets)
            loss = self.loss_fn(outputs, targets)
            self.state.scaler.scale(loss * loss_scale).backward()
        return loss

    def _optimizer_step(self) -> Optional[torch.Tensor]:
        """Clip (on unscaled gradients), step, update the loss scale, clear gradients, advance LR and EMA.

        Returns the gradient norm when clipping computed one (a tensor on the device), else None.
        """
        s, grad_norm = self.state, None
        if self.settings.grad_clip_norm is not None:
            s.scaler.unscale_(s.optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(s.model.parameters(), self.settings.grad_clip_norm)
        s.scaler.step(s.optimizer)
        s.scaler.update()
        s.optimizer.zero_grad(set_to_none=True)
        s.scheduler.step()
        if s.ema is not None:
            s.ema.update_parameters(s.model)
        s.metrics = {}  # new weights: the last evaluation no longer describes them
        return grad_norm

    def _after_step(self) -> None:
        step = self.state.progress.step
        if step % self.settings.log_every == 0:
            self.check_finite(f"at step {step}")  # with the train row's reduction, not a sync per step
        self._call("after_step")
        if self._checkpoint_requested:
            self._checkpoint_requested = False
            self.save_checkpoint()

    def _call(self, event: str) -> None:
        for hook in self.hooks:
            method = getattr(hook, event, None)
            if method is not None:
                method(self)
