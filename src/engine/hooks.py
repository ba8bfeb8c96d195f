"""The hook protocol of the Trainer (src/engine/trainer.py), and the small standard hooks.

A hook is an object with any of four methods; each receives the Trainer and runs on every rank:

    before_train(trainer)   once, before the first step (after a resume: trainer.state.progress is restored)
    after_step(trainer)     after every optimizer step (trainer.state.progress.step already counts it;
                            trainer.last_step holds the step's local loss sum, images and timings)
    after_epoch(trainer)    after each completed epoch, and once more when training ends mid-epoch
                            because it is over (trainer.max_steps); trainer.epoch is the epoch just
                            trained, trainer.epoch_complete says whether it ran to its end,
                            trainer.finishing whether this is the last call
    after_train(trainer)    once, however the loop ended: normally, by a stop request, or by an error
                            (it runs in a `finally`; the error propagates once every hook has run)

Hooks run in list order. The standard list (src/commands/train.py) is NormSyncHook (norm_sync.py), MetricsHook,
StopAtMaxSteps, SampleGridHook, PreciseBNHook (with trainer.precise_bn_batches, precise_bn_hook.py), EvalHook, the
task's own (Task.train_hooks), EarlyStopHook (with trainer.early_stop.metric, early_stop_hook.py), CheckpointHook,
then CompileReport (with
trainer.compile, compile.py) and PreemptionHook (preemption.py) last: evaluation runs before the checkpoint that
records its metrics.

Controlling the loop from a hook:

    trainer.request_checkpoint()    write last.pt once this step's after_step hooks have all run
    trainer.request_stop(reason)    end training after this step: the partial epoch is closed with
                                    after_epoch (evaluation, checkpoint), then after_train
    trainer.request_stop(reason, exit_code=N)
                                    an interruption (e.g. preemption): no after_epoch, after_train runs,
                                    and train.py exits with N once everything is torn down

Both requests are honoured after every hook's after_step, whatever the hook order. Hooks that call
collectives (anything in src.comm) must make the same calls on every rank at the same step: decide from
state every rank shares (the step count, reduced values), never from something only one rank saw.

Adding a hook: subclass Hook (or write any object with these methods), override what you need, and
append an instance to the `hooks` list in src/commands/train.py's `build_hooks`; a task's hooks come from its
`Task.train_hooks` (src/tasks/base.py), objects with these methods (a task does not import the engine).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Protocol, Sequence

import torch
from torch import nn

from src import comm
from src.data.batch import Batch
from src.engine.checkpoint.files import CheckpointSaver
from src.engine.checkpoint.state import TrainState
from src.engine.norm_health import check_norm_health
from src.engine.optim import current_lr
from src.engine.tracking import Tracker

log = logging.getLogger(__name__)


@dataclass
class StepOutput:
    """What one optimizer step did on this rank (nothing reduced, nothing synchronised)."""

    loss_sum: torch.Tensor  # float64 on the device: sum over the step's micro-batches of mean loss x batch size
    images: int  # images this rank processed in the step
    seconds: float  # wall time of the step, from the first data wait to after the optimizer step
    data_seconds: float  # of which waiting for the loader


class TrainerView(Protocol):
    """What a hook sees of the Trainer (src/engine/trainer.py): declared here, so hooks never import the loop."""

    state: TrainState
    loader: Any
    saver: Optional[CheckpointSaver]
    eval_module: nn.Module
    epoch: int
    epoch_complete: bool
    finishing: bool
    started: float
    stop_reason: Optional[str]
    last_step: Optional[StepOutput]
    batch: Optional[Batch]  # the last micro-batch on the device (src/data/batch.py)

    def request_stop(self, reason: str, exit_code: Optional[int] = None) -> None:
        """End training after the current step; with `exit_code`, as an interruption."""

    def request_checkpoint(self) -> None:
        """Write last.pt once the current step's hooks have run."""

    def save_checkpoint(self) -> Optional[Path]:
        """Write last.pt (and a best-k file when the current weights were evaluated). A collective."""

    def sync_buffers(self) -> None:
        """Make per-rank BN statistics equal on all ranks (a collective)."""

    def show(self, **fields: str) -> None:
        """Put short values on rank 0's progress bar."""


class Hook:
    """Base class: every method is a no-op; override the ones a side job needs."""

    def before_train(self, trainer: TrainerView) -> None:
        """Once, before the first step."""

    def after_step(self, trainer: TrainerView) -> None:
        """After every optimizer step."""

    def after_epoch(self, trainer: TrainerView) -> None:
        """After every completed epoch, and at the end of training."""

    def after_train(self, trainer: TrainerView) -> None:
        """Once, after the loop."""


class MetricsHook(Hook):
    """Every `every` steps: the train row (loss over all ranks' samples, lr, images/s, data wait per step)."""

    def __init__(self, tracker: Tracker, every: int) -> None:
        self.tracker, self.every = tracker, every
        self._reset()

    def _reset(self) -> None:
        self.loss_sum: Optional[torch.Tensor] = None  # on the device: no host sync per step
        self.images = self.steps = 0
        self.step_seconds = self.data_seconds = 0.0

    def after_step(self, trainer: TrainerView) -> None:
        """Accumulate the step locally; reduce over ranks and log every `every` steps (a collective)."""
        out = trainer.last_step
        self.loss_sum = out.loss_sum if self.loss_sum is None else self.loss_sum + out.loss_sum
        self.images += out.images
        self.steps += 1
        self.step_seconds += out.seconds
        self.data_seconds += out.data_seconds
        step = trainer.state.progress.step
        if step % self.every:
            return
        sums = comm.reduce_dict({"loss_sum": float(self.loss_sum), "images": float(self.images),
                                 "seconds": self.step_seconds, "data_seconds": self.data_seconds}, average=False)
        world = comm.get_world_size()
        metrics = {"loss": sums["loss_sum"] / max(sums["images"], 1.0), "lr": current_lr(trainer.state.optimizer),
                   # images of all ranks over the time a rank spent in training steps (evaluation excluded)
                   "throughput": sums["images"] / max(sums["seconds"] / world, 1e-9),
                   "data_time": sums["data_seconds"] / world / self.steps}
        self.tracker.log("train", trainer.epoch, step, metrics)
        trainer.show(loss=f"{metrics['loss']:.3f}", lr=f"{metrics['lr']:.3g}", img_s=f"{metrics['throughput']:.0f}")
        self._reset()


class StopAtMaxSteps(Hook):
    """Ends training once `max_steps` optimizer steps are done (also right away on a resume past it)."""

    def __init__(self, max_steps: Optional[int]) -> None:
        self.max_steps = max_steps

    def before_train(self, trainer: TrainerView) -> None:
        """A run resumed at or past max_steps trains no further."""
        self.after_step(trainer)

    def after_step(self, trainer: TrainerView) -> None:
        """Request the stop when the step count reaches max_steps."""
        if self.max_steps is not None and trainer.state.progress.step >= self.max_steps:
            trainer.request_stop(f"trainer.max_steps={self.max_steps} reached")


class SampleGridHook(Hook):
    """Logs a grid of the first training batch (rank 0's shard) after the first step of the run."""

    def __init__(self, log_grid: Callable[[torch.Tensor, torch.Tensor, int], None]) -> None:
        self.log_grid, self.done = log_grid, False

    def after_step(self, trainer: TrainerView) -> None:
        """Once: hand the last micro-batch's images and labels (before MixUp) to `log_grid`."""
        if not self.done and trainer.batch is not None:
            self.log_grid(trainer.batch.images, trainer.batch.targets, trainer.state.progress.step)
            self.done = True


class EvalHook(Hook):
    """Every `every` completed epochs and at the end: exact evaluation of the model (and EMA), a `val` row."""

    def __init__(self, evaluate: Callable[[torch.nn.Module], dict[str, float]], every: int, tracker: Tracker,
                 pictures: Optional[Callable[[torch.nn.Module, int], None]] = None) -> None:
        self.evaluate, self.every, self.tracker, self.pictures = evaluate, every, tracker, pictures

    def after_epoch(self, trainer: TrainerView) -> None:
        """Evaluate when due; the metrics go to trainer.state.metrics for the checkpoint of these weights."""
        due = trainer.epoch_complete and (trainer.epoch + 1) % self.every == 0
        if not (due or trainer.finishing):
            return
        step = trainer.state.progress.step
        trainer.sync_buffers()  # per-rank BN statistics (model and EMA) made equal first
        check_norm_health(trainer.state.model, f"before evaluation at step {step}", strict=False)
        metrics = self.evaluate(trainer.eval_module)
        if trainer.state.ema is not None:
            metrics.update({f"ema_{k}": v for k, v in self.evaluate(trainer.state.ema.module).items()})
        trainer.state.metrics = metrics  # the same dict on every rank
        self.tracker.log("val", trainer.epoch, step, metrics)
        if self.pictures is not None:
            self.pictures(trainer.state.model, step)


class CheckpointHook(Hook):
    """last.pt every `every` optimizer steps (0: off) and after every epoch; best-k after evaluations."""

    def __init__(self, every: int, shown: Sequence[str] = ("loss",)) -> None:
        self.every = every
        self.shown = tuple(shown)  # the metrics the epoch's log line shows (the task's, and their EMA twins)

    def after_step(self, trainer: TrainerView) -> None:
        """Ask for last.pt on the step schedule (written once all hooks of the step have run)."""
        if self.every and trainer.state.progress.step % self.every == 0:
            trainer.request_checkpoint()

    def after_epoch(self, trainer: TrainerView) -> None:
        """Write last.pt, and a best-k file when these weights were just evaluated."""
        path = trainer.save_checkpoint()
        metrics = trainer.state.metrics
        shown = [k for k in self.shown if k in metrics]
        log.info("epoch %d done at step %d (%.0fs): %s; checkpoint %s", trainer.epoch, trainer.state.progress.step,
                 time.perf_counter() - trainer.started,
                 ", ".join(f"{k}={metrics[k]:.4g}" for k in shown) or "not evaluated", path)
