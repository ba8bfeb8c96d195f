"""`train.py`'s body: validate -> device -> process group -> run dir -> data -> model -> state -> hooks -> train.

Read top to bottom, `run` and `_train` are the whole recipe; each step is a call into a module that does
one job. The loop is src/engine/trainer.py, the side jobs are hooks (src/engine/hooks.py).
"""
from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from src import dist
from src.config import TrainConfig, best_metric_of, task_of, validate_config
from src.data import DataBundle, build_datasets, build_eval_loader, build_train_loader
from src.engine.accumulation import optimizer_steps_per_epoch
from src.engine.amp import PRECISIONS, build_scaler
from src.engine.batch_mix import build_mix
from src.engine.checkpoint.files import CheckpointSaver
from src.engine.compile import CompileReport, compile_failure, compile_modules
from src.engine.ema import build_ema
from src.engine.evaluation.evaluator import evaluate
from src.engine.hooks import (CheckpointHook, EvalHook, Hook, MetricsHook, NormSyncHook, SampleGridHook,
                              StopAtMaxSteps)
from src.engine.losses import build_loss
from src.engine.norm_health import buffer_sync_mode, check_norm_health
from src.engine.optim import build_optimizer, build_scheduler, trainable
from src.engine.preemption import PreemptionHook
from src.engine.checkpoint.rundir import resolve_run_dir, resume_checkpoint
from src.engine.seeding import configure_determinism, configure_threads, seed_everything
from src.engine.checkpoint.state import TrainState, read_checkpoint
from src.engine.tracking import Tracker
from src.engine.trainer import Trainer
from src.engine.wrap import wrap_model
from src.logger import setup_logging
from src.models import build_model
from src.models.norms import NormSync, checked_cuda_syncbn

log = logging.getLogger("src.commands.train")


def run(cfg: DictConfig | dict) -> dict[str, float]:
    """Train as configured; returns the last validation metrics (on every rank).

    A stop requested with an exit code (e.g. by a preemption hook) raises SystemExit with that code
    once logs, TensorBoard and the process group are closed.
    """
    # Before any process group: a typo fails fast on every rank.
    cfg = validate_config(cfg, world_size=dist.launch_world_size())
    typed: TrainConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    device = dist.select_device(typed.device)
    threads = configure_threads(typed.trainer.num_threads, dist.get_local_world_size()) if device.type == "cpu" else 0
    dist.init_distributed(device, timeout_s=typed.trainer.dist_timeout_s,
                          init_timeout_s=typed.trainer.dist_init_timeout_s)
    tracker: Optional[Tracker] = None
    try:
        run_dir = resolve_run_dir()
        setup_logging(run_dir, dist.get_rank())
        tracker = Tracker(run_dir, enabled=dist.is_main_process(), tensorboard=typed.trainer.tensorboard)
        log.info("run dir %s | %d process(es) on %s | %s CPU threads each", run_dir, dist.get_world_size(),
                 device, threads or "-")
        if tracker.writer is not None:
            log.info("TensorBoard logs: %s  (view: tensorboard --logdir %s)", tracker.tb_dir, tracker.tb_dir)
        try:
            trainer, metrics = _train(cfg, typed, device, run_dir, tracker)
        except RuntimeError as err:
            failure = compile_failure(err, typed) if typed.trainer.compile else None
            if failure is not None:
                raise failure from None  # PyTorch's reason is in the message; its traceback page is not
            if not dist.is_timeout(err):
                raise
            # gloo / NCCL say only "Timed out waiting 20000ms": name the setting and the usual causes.
            raise RuntimeError(
                f"a collective waited longer than trainer.dist_timeout_s={typed.trainer.dist_timeout_s:g} s: "
                "another rank died, hung or stalled (see its log). If steps or evaluations are legitimately "
                "that slow, raise trainer.dist_timeout_s. Checkpoints already written are intact."
            ) from err
        tracker.flush()
    finally:
        _close(tracker)
        dist.destroy()
    if trainer.exit_code is not None:
        raise SystemExit(trainer.exit_code)
    return metrics


def _train(cfg: DictConfig, typed: TrainConfig, device: torch.device, run_dir: Path,
           tracker: Tracker) -> tuple[Trainer, dict[str, float]]:
    """Build data, model and TrainState, resume, assemble the hooks, train; returns the trainer and last metrics."""
    rank, world, settings = dist.get_rank(), dist.get_world_size(), typed.trainer
    configure_determinism(settings.deterministic)
    task = task_of(typed)
    data = build_datasets(typed.data, seed=typed.seed)
    train_loader = build_train_loader(data.train, typed.data, rank, world, typed.seed, drop_last=True)
    val_loader = build_eval_loader(data.val, typed.data, rank, world)

    seed_everything(typed.seed)  # same seed on every rank before the build: identical initial weights
    model = build_model(typed.model, typed.norm, data.num_classes).to(device, PRECISIONS[settings.dtype])
    model = checked_cuda_syncbn(model, typed.norm, device)  # norm.cuda_selfcheck: our kernels vs torch's on this GPU
    norm_sync = NormSync(model, typed.norm, settings.dist_timeout_s)  # collective with norm.group_size
    if settings.channels_last:
        model = model.to(memory_format=torch.channels_last)
    seed_everything(typed.seed + rank)  # everything random from here (dropout, MixUp) differs per rank
    check_norm_health(model, "after build", strict=False)  # DDP broadcasts rank 0's weights anyway
    module = wrap_model(model, settings, device)
    state = _build_state(cfg, typed, model, len(train_loader), device)
    state.class_names = list(data.class_names)  # stored in checkpoints: predict.py names its classes
    _resume(state, settings.resume, run_dir)
    check_norm_health(model, "start", strict=True)

    module, eval_module = compile_modules(module, model, settings)  # trainer.compile (else unchanged)

    loss = build_loss(task, settings.label_smoothing, data.ignore_index, typed.model.aux_loss_weight)
    trainer = Trainer(state, module, train_loader, loss, settings, device,
                      hooks=build_hooks(typed, task, data, val_loader, tracker, device, norm_sync),
                      saver=CheckpointSaver(run_dir, best_metric_of(typed), settings.keep_best),
                      mix=build_mix(settings, data.num_classes), eval_module=eval_module,
                      buffer_sync=buffer_sync_mode(typed))
    trainer.train()
    return trainer, state.metrics  # the final evaluation's (training always ends with one)


def _build_state(cfg: DictConfig, typed: TrainConfig, model: torch.nn.Module, micro_batches: int,
                 device: torch.device) -> TrainState:
    """Optimizer, LR schedule (fitted to min(epochs, max_steps)), GradScaler and EMA of `model`, as a TrainState."""
    settings, world = typed.trainer, dist.get_world_size()
    effective_batch = world * typed.data.batch_size * settings.grad_accum_steps
    steps_per_epoch = optimizer_steps_per_epoch(micro_batches, settings.grad_accum_steps)
    total_steps = steps_per_epoch * settings.epochs
    if settings.max_steps is not None:
        total_steps = min(total_steps, settings.max_steps)
    optimizer = build_optimizer(model, typed.optim, effective_batch)
    log.info("%s: %s with norm=%s, %.2fM trainable parameters; effective batch %d = %d process(es) x %d x %d "
             "accumulation; %d optimizer steps/epoch, %d in total", task_of(typed), typed.model.name,
             typed.norm.name, trainable(model.parameters()) / 1e6, effective_batch, world, typed.data.batch_size,
             settings.grad_accum_steps, steps_per_epoch, total_steps)
    return TrainState(model, optimizer, build_scheduler(optimizer, typed.sched, steps_per_epoch, total_steps),
                      build_scaler(settings.amp, device), build_ema(model, settings.ema_decay) if settings.ema else None,
                      config=OmegaConf.to_container(cfg, resolve=True))


def build_hooks(typed: TrainConfig, task: str, data: DataBundle, val_loader: Any, tracker: Tracker,
                device: torch.device, norm_sync: NormSync) -> list[Hook]:
    """The side jobs of a run, in the order they run (evaluation before the checkpoint that records it)."""
    settings = typed.trainer
    evaluate_fn = partial(_evaluate, val_loader=val_loader, task=task, data=data, device=device, amp=settings.amp)
    hooks: list[Hook] = [NormSyncHook(norm_sync), MetricsHook(tracker, settings.log_every),
                         StopAtMaxSteps(settings.max_steps)]
    if tracker.writer is not None and task == "classification":
        hooks.append(SampleGridHook(partial(_log_grid, tracker, typed)))
    hooks.append(EvalHook(evaluate_fn, settings.eval_every, tracker, _panels(tracker, typed, task, data, device)))
    hooks.append(CheckpointHook(settings.checkpoint_every))
    if settings.compile:
        hooks.append(CompileReport())
    # Last: it sees the step's or the epoch's checkpoint already requested or written.
    hooks.append(PreemptionHook(settings.preempt_signals, loaders=[val_loader]))
    return hooks


def _resume(state: TrainState, resume: str, run_dir: Path) -> None:
    """Load trainer.resume's checkpoint into `state` (nothing for resume=none or a run with no checkpoint yet)."""
    path = resume_checkpoint(resume, run_dir)
    if path is None:
        return
    state.load_state_dict(read_checkpoint(path), source=str(path))
    p = state.progress
    log.info("resumed from %s at epoch %d, step %d, micro-batch %d", path, p.epoch, p.step, p.micro_batch)


def _evaluate(module: torch.nn.Module, *, val_loader: Any, task: str, data: DataBundle, device: torch.device,
              amp: str) -> dict[str, float]:
    """The exact distributed evaluation of `module` on the validation set (the same dict on every rank)."""
    return evaluate(module, val_loader, task, data.num_classes, device, amp=amp, ignore_index=data.ignore_index,
                    class_names=list(data.class_names))


def _panels(tracker: Tracker, typed: TrainConfig, task: str, data: DataBundle, device: torch.device) -> Any:
    """image | truth | prediction pictures after each segmentation evaluation (rank 0, with TensorBoard)."""
    if task != "segmentation" or tracker.writer is None:
        return None
    from src.engine.evaluation.visualize import log_segmentation_panels

    return lambda model, step: log_segmentation_panels(
        tracker.writer, model, data.val, step, device, mean=typed.data.mean, std=typed.data.std,
        ignore_index=data.ignore_index, amp=typed.trainer.amp)


def _log_grid(tracker: Tracker, typed: TrainConfig, images: torch.Tensor, targets: torch.Tensor, step: int) -> None:
    """A grid of up to 32 training images in TensorBoard."""
    from src.engine.evaluation.visualize import log_classification_grid

    log_classification_grid(tracker.writer, images[:32].cpu(), step, targets=targets[:32].cpu(),
                            mean=list(typed.data.mean), std=list(typed.data.std))


def _close(tracker: Optional[Tracker]) -> None:
    """Close TensorBoard and say where its events are."""
    if tracker is None:
        return
    has_events = tracker.writer is not None
    tracker.close()
    if has_events:
        print(f"TensorBoard logs are in {tracker.tb_dir}  (view: tensorboard --logdir {tracker.tb_dir})", flush=True)
