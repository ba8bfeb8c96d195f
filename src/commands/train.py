"""`train.py`'s body: plan the start (run folder, config, resume) -> device -> process group -> data -> model ->
state and checkpoint -> commit (the run folder is written from here on) -> trackers -> hooks -> train.

Read top to bottom, `run` and `_train` are the whole recipe; each step is a call into a module that does
one job. Every check that can fail on the user's input (config, run folder, device, data, checkpoint) comes
before the commit (src/commands/start.py): a failed start changes no file and leaves no new folder. The loop is
src/engine/trainer.py, the side jobs are hooks (src/engine/hooks.py).
"""
from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import DictConfig

from src import comm, process_group
from src.commands.continue_command import continue_command
from src.commands.dry_run import forward_one_batch, model_facts, print_summary
from src.commands.run_dir import agree_run_dir
from src.commands.run_summary import print_run_summary
from src.commands.start import StartPlan, plan_start
from src.commands.start_log import launch_rank, log_to_console
from src.config import TrainConfig, best_metric_of, config_dict, register_train_schema
from src.cpu_threads import configure_threads
from src.data import DataBundle, build_datasets, build_eval_loader, build_train_loader, close_loaders
from src.data.device_transforms import device_transforms_enabled
from src.engine.accumulation import optimizer_steps_per_epoch
from src.engine.checkpoint.files import CheckpointSaver, checkpoint_dir
from src.engine.checkpoint.schedule import refit_schedule
from src.engine.checkpoint.state import TrainState, read_checkpoint
from src.engine.compile import CompileReport, compile_failure, compile_modules
from src.engine.early_stop_hook import EarlyStopHook
from src.engine.hooks import CheckpointHook, EvalHook, Hook, MetricsHook, SampleGridHook, StopAtMaxSteps
from src.engine.norm_health import check_norm_health
from src.engine.norm_sync import NormSyncHook, buffer_sync_mode, create_norm_groups
from src.engine.optim import build_ema, build_optimizer, build_scheduler, trainable
from src.engine.precise_bn_hook import PreciseBNHook
from src.engine.preemption import EXIT_INTERRUPTED, PreemptionHook
from src.engine.seeding import configure_determinism, seed_everything
from src.engine.trackers.build import build_sinks
from src.engine.trackers.params import run_tags
from src.engine.trackers.sink import FAILED, FINISHED, KILLED, RunInfo
from src.engine.tracking import Tracker
from src.engine.trainer import Trainer
from src.engine.wrap import wrap_model
from src.errors import UserError
from src.evaluation.loop import evaluate
from src.models import build_model
from src.models.activation_checkpointing import enable_activation_checkpointing
from src.models.norms import checked_cuda_syncbn
from src.models.registry import model_family
from src.precision import PRECISIONS, build_scaler
from src.tasks import Task

log = logging.getLogger("src.commands.train")

# conf/train.yaml composes onto `train_schema`: stored when this module is imported, so also in a process that a
# Hydra launcher starts for a sweep's job (submitit composes the config again there, after unpickling `run`).
register_train_schema()


def run(cfg: DictConfig | dict) -> dict[str, float]:
    """Train as configured; returns the last validation metrics (on every rank).

    A stop requested with an exit code (a preemption signal: 75, Ctrl-C: 130) raises SystemExit with that code
    once logs, TensorBoard and the process group are closed.
    """
    log_to_console()  # into the run folder's log files only once the start has passed every check
    try:
        return _run(cfg)
    except KeyboardInterrupt:  # Ctrl-C before training (during it, PreemptionHook stops at a step instead)
        log.log(logging.WARNING if launch_rank() == 0 else logging.INFO,
                "interrupted (Ctrl-C) before training started: no checkpoint was written")
        raise SystemExit(EXIT_INTERRUPTED) from None


def _run(cfg: DictConfig | dict) -> dict[str, float]:
    # Before any process group: the config, and the run folder's refusals, fail fast on every rank.
    plan = plan_start(cfg, world_size=process_group.launch_world_size())
    config = plan.config
    device = process_group.select_device(config.device)
    threads = configure_threads(config.trainer.num_threads, comm.get_local_world_size()) if device.type == "cpu" else 0
    process_group.init_distributed(device, timeout_s=config.trainer.dist_timeout_s,
                          init_timeout_s=config.trainer.dist_init_timeout_s)
    try:
        run_dir = agree_run_dir(plan.run_dir)  # rank 0's folder (ranks may differ by a second in the default)
        if config.trainer.dry_run:
            _dry_run(config, device, run_dir)
            return {}
        log.info("run dir %s | %d process(es) on %s | %s CPU threads each", run_dir, comm.get_world_size(),
                 device, threads or "-")
        try:
            exit_code, metrics = _train(config, device, run_dir, plan)
        except RuntimeError as err:
            failure = compile_failure(err, config) if config.trainer.compile else None
            if failure is not None:
                raise failure from None  # PyTorch's reason is in the message; its traceback page is not
            if not comm.is_timeout(err):
                raise
            # gloo / NCCL say only "Timed out waiting 20000ms": name the setting and the usual causes.
            raise RuntimeError(
                f"a collective waited longer than trainer.dist_timeout_s={config.trainer.dist_timeout_s:g} s: "
                "another rank died, hung or stalled (see its log). If steps or evaluations are legitimately "
                "that slow, raise trainer.dist_timeout_s. Checkpoints already written are intact."
            ) from err
    finally:
        process_group.destroy()
    if exit_code is not None:
        raise SystemExit(exit_code)
    print_run_summary(run_dir, config.resolved_task, best_metric_of(config))  # rank 0: the best checkpoint, the next commands
    return metrics


def _train(config: TrainConfig, device: torch.device, run_dir: Path,
           plan: StartPlan) -> tuple[Optional[int], dict[str, float]]:
    """Build the data and its loaders, then train (_fit); returns the exit code a stop asked for and the last
    metrics."""
    rank, world, settings = comm.get_rank(), comm.get_world_size(), config.trainer
    configure_determinism(settings.deterministic)
    task = config.resolved_task
    data = build_datasets(config.data, task.data, seed=config.seed,
                          device_transforms=task.data.device_transforms  # tasks whose batches are not tensors: off
                          and device_transforms_enabled(config.data.device_transforms, device))
    train_loader = build_train_loader(data.train, config.data, rank, world, config.seed, drop_last=True,
                                      collate=task.data.collate)
    val_loader = build_eval_loader(data.val, config.data, rank, world, collate=task.data.collate)
    try:
        return _fit(config, device, run_dir, plan, task, data, train_loader, val_loader)
    finally:  # the loader workers end here, also when training failed (src/data/closable_loader.py says why)
        close_loaders(train_loader, val_loader)


def _fit(config: TrainConfig, device: torch.device, run_dir: Path, plan: StartPlan, task: Task, data: DataBundle,
         train_loader: Any, val_loader: Any) -> tuple[Optional[int], dict[str, float]]:
    """Model, TrainState, resume; the commit; trackers, hooks, the Trainer; train it.

    Returns no model, trainer or state: the process group is torn down next, and a group's threads end
    with the last reference to it (DDP holds one), while the interpreter is whole, not during its shutdown.
    """
    settings, world, options = config.trainer, comm.get_world_size(), task.options(config)
    model = _build_model(config, data.num_classes, device)
    check_norm_health(model, "after build", strict=False)  # DDP broadcasts rank 0's weights anyway
    module = wrap_model(model, settings, device)
    state = _build_state(config, model, len(train_loader), device)
    state.class_names = list(data.class_names)  # stored in checkpoints: predict.py names its classes
    resumed = _resume(state, plan.checkpoint, partial(_build_schedule, config, len(train_loader)))
    plan.commit(run_dir)  # every check passed on every rank: from here on the run folder is written

    main = comm.is_main_process()
    tracker = Tracker(run_dir, enabled=main,
                      tensorboard=config.trainer.tensorboard and config.tracker.tensorboard is not None,
                      sinks=build_sinks(config.tracker) if main else (), queue_size=config.tracker.queue_size,
                      finish_timeout_s=config.tracker.finish_timeout_s,
                      abort_timeout_s=config.tracker.abort_timeout_s, resume_point=plan.resume_point)
    status = FAILED  # how the tracker runs end unless training gets to its end
    try:
        if tracker.writer is not None:
            log.info("TensorBoard logs: %s  (view: tensorboard --logdir %s)", tracker.tb_dir, tracker.tb_dir)
        if tracker.background is not None:  # the tracker runs open now: a resume continues the checkpoint's
            tracker.start(RunInfo(run_dir, state.config, run_tags(state.config, world), resumed,
                                  resume_point=plan.resume_point), state.trackers)
        check_norm_health(model, "start", strict=True)

        module, eval_module = compile_modules(module, model, settings)  # trainer.compile (else unchanged)

        trainer = Trainer(state, module, train_loader, task.loss(options), settings, device,
                          hooks=build_hooks(config, task, data, val_loader, tracker, device, continue_command(run_dir)),
                          saver=CheckpointSaver(run_dir, best_metric_of(config), settings.keep_best,
                                                higher_is_better=task.higher_is_better(best_metric_of(config))),
                          mix=task.batch_mix(options, data.num_classes), eval_module=eval_module,
                          buffer_sync=buffer_sync_mode(config), device_transform=data.device_transform, task=task)
        trainer.train()
        if state.best:  # tracker.mlflow.log_best_checkpoint: the best-k best, once training has ended
            tracker.log_artifact(checkpoint_dir(run_dir) / state.best[0][1])
        comm.barrier()  # every rank is past its last collective before any of them tears the groups down
        tracker.flush()
        status = KILLED if trainer.exit_code is not None else FINISHED
        return trainer.exit_code, state.metrics  # the final evaluation's (training always ends with one)
    finally:
        _close(tracker, status)


def _build_model(config: TrainConfig, num_classes: int, device: torch.device) -> torch.nn.Module:
    """The model as training starts from it: the same initial weights on every rank, norm groups formed."""
    seed_everything(config.seed)  # same seed on every rank before the build: identical initial weights
    model = build_model(config.model, config.norm, num_classes).to(device, PRECISIONS[config.trainer.dtype])
    model = checked_cuda_syncbn(model, config.norm, device)  # norm.cuda_selfcheck: our kernels vs torch's on this GPU
    if config.trainer.activation_checkpointing:
        regions = enable_activation_checkpointing(model, model_family(config.model.name))
        log.info("activation checkpointing: %s", ", ".join(regions))
    create_norm_groups(config.norm, config.trainer.dist_timeout_s)  # a collective
    if config.trainer.channels_last:
        model = model.to(memory_format=torch.channels_last)
    seed_everything(config.seed + comm.get_rank())  # everything random from here (dropout, MixUp) differs per rank
    return model


def _dry_run(config: TrainConfig, device: torch.device, run_dir: Path) -> None:
    """trainer.dry_run: build data, model and its wrapping as training does, one training-mode forward, summary.
    Nothing is written: the run folder is not made."""
    rank, world, settings = comm.get_rank(), comm.get_world_size(), config.trainer
    configure_determinism(settings.deterministic)
    task = config.resolved_task
    data = build_datasets(config.data, task.data, seed=config.seed,
                          device_transforms=task.data.device_transforms  # tasks whose batches are not tensors: off
                          and device_transforms_enabled(config.data.device_transforms, device))
    train_loader = build_train_loader(data.train, config.data, rank, world, config.seed, drop_last=True,
                                      collate=task.data.collate)
    val_loader = build_eval_loader(data.val, config.data, rank, world, collate=task.data.collate)
    try:
        _dry_run_forward(config, device, run_dir, task, data, train_loader)
    finally:
        close_loaders(train_loader, val_loader)


def _dry_run_forward(config: TrainConfig, device: torch.device, run_dir: Path, task: Task, data: DataBundle,
                     train_loader: Any) -> None:
    """The dry run's model, one training-mode forward of the first batch, and the summary."""
    world, settings = comm.get_world_size(), config.trainer
    if len(train_loader) == 0:
        raise UserError(f"data.batch_size={config.data.batch_size} x {world} process(es) is more than the "
                        f"{len(data.train)} training samples: not one full micro-batch per epoch")
    model = _build_model(config, data.num_classes, device)
    module = wrap_model(model, settings, device).train()
    # As the trainer does: on the device in the model's dtype (uint8 batches finished by device transforms).
    batch = forward_one_batch(module, next(iter(train_loader)), task, device=device, amp=settings.amp,
                              channels_last=settings.channels_last, loss_fn=task.loss(task.options(config)),
                              transform=data.device_transform)
    steps = optimizer_steps_per_epoch(len(train_loader), settings.grad_accum_steps)
    effective = world * config.data.batch_size * settings.grad_accum_steps
    print_summary("train.py", {
        "model": f"{config.model.name} ({task.name}, {data.num_classes} classes), norm={config.norm.name}",
        **model_facts(model),
        "world size": f"{world} process(es) on {device}",
        "batch": f"{config.data.batch_size} per rank, effective {effective} = {world} x {config.data.batch_size} x "
                 f"{settings.grad_accum_steps} accumulation",
        "data": f"{config.data.name}: {len(data.train)} train / {len(data.val)} val samples",
        "steps per epoch": f"{steps} optimizer steps ({len(train_loader)} micro-batches per rank); "
                           f"{settings.epochs} epoch(s), max_steps={settings.max_steps}",
        "first batch": f"input {batch['input']} -> output {batch['output']}, loss {batch['loss']:.4f} (rank 0)",
        "run dir": str(run_dir),
    })
    # Every rank leaves together: a rank tearing the groups down while its peer is still between the forward's
    # collective and its own teardown could make gloo abort the peer at exit (seen once in 2-process runs).
    comm.barrier()


def _build_state(config: TrainConfig, model: torch.nn.Module, micro_batches: int,
                 device: torch.device) -> TrainState:
    """Optimizer, LR schedule (fitted to min(epochs, max_steps)), GradScaler and EMA of `model`, as a TrainState."""
    settings, world = config.trainer, comm.get_world_size()
    effective_batch = world * config.data.batch_size * settings.grad_accum_steps
    steps_per_epoch = optimizer_steps_per_epoch(micro_batches, settings.grad_accum_steps)
    total_steps = steps_per_epoch * settings.epochs
    if settings.max_steps is not None:
        total_steps = min(total_steps, settings.max_steps)
    optimizer = build_optimizer(model, config.optim, effective_batch)
    log.info("%s: %s with norm=%s, %.2fM trainable parameters; effective batch %d = %d process(es) x %d x %d "
             "accumulation; %d optimizer steps/epoch, %d in total", config.resolved_task.name, config.model.name,
             config.norm.name, trainable(model.parameters()) / 1e6, effective_batch, world, config.data.batch_size,
             settings.grad_accum_steps, steps_per_epoch, total_steps)
    return TrainState(model, optimizer, _build_schedule(config, micro_batches, optimizer),
                      build_scaler(settings.amp, device), build_ema(model, settings.ema_decay) if settings.ema else None,
                      config=config_dict(config))


def _schedule_length(trainer: Any) -> tuple[Any, Any]:
    """What the LR schedule's length comes from (with the data and the world size, which a resume keeps)."""
    get = trainer.get if isinstance(trainer, dict) else partial(getattr, trainer)
    return get("epochs"), get("max_steps")


def _build_schedule(config: TrainConfig, micro_batches: int, optimizer: torch.optim.Optimizer) -> Any:
    """The LR schedule, fitted to min(epochs, max_steps) optimizer steps."""
    steps_per_epoch = optimizer_steps_per_epoch(micro_batches, config.trainer.grad_accum_steps)
    total_steps = steps_per_epoch * config.trainer.epochs
    if config.trainer.max_steps is not None:
        total_steps = min(total_steps, config.trainer.max_steps)
    return build_scheduler(optimizer, config.sched, steps_per_epoch, total_steps)


def build_hooks(config: TrainConfig, task: Task, data: DataBundle, val_loader: Any, tracker: Tracker,
                device: torch.device, continue_with: str = "") -> list[Hook]:
    """The side jobs of a run, in the order they run (evaluation before the checkpoint that records it)."""
    settings = config.trainer
    evaluate_fn = partial(_evaluate, val_loader=val_loader, task=task, data=data, device=device, amp=settings.amp,
                          threads=settings.eval_num_threads)
    hooks: list[Hook] = [NormSyncHook(config.norm), MetricsHook(tracker, settings.log_every),
                         StopAtMaxSteps(settings.max_steps)]
    if tracker.writer is not None:  # the task's pictures of the first training batch (if it has any)
        hooks.append(SampleGridHook(partial(task.log_train_samples, tracker.writer, mean=list(config.data.mean),
                                            std=list(config.data.std))))
    if settings.precise_bn_batches:  # before EvalHook: the evaluation it precedes sees the recomputed statistics
        hooks.append(PreciseBNHook(settings, device))
    hooks.append(EvalHook(evaluate_fn, settings.eval_every, tracker, _panels(tracker, config, task, data, device)))
    hooks += task.train_hooks(config, writer=tracker.writer)  # the task's own, after its evaluation
    if settings.early_stop.metric is not None:  # between the evaluation and the checkpoint that records it
        hooks.append(EarlyStopHook(settings.early_stop, settings.early_stop.higher_is_better(task)))
    hooks.append(CheckpointHook(settings.checkpoint_every, shown=(*task.metrics, f"ema_{task.default_metric}")))
    if settings.compile:
        hooks.append(CompileReport())
    # Last: it sees the step's or the epoch's checkpoint already requested or written.
    hooks.append(PreemptionHook(settings.preempt_signals, loaders=[val_loader], continue_command=continue_with))
    return hooks


def _resume(state: TrainState, checkpoint: Optional[Path], build_schedule: Any) -> bool:
    """Load the start's checkpoint into `state` (nothing for a new run); returns whether one was loaded.

    A resume with another length (trainer.epochs, trainer.max_steps) gets the LR schedule of that length, replayed
    to the checkpoint's step (src/engine/checkpoint/schedule.py).
    """
    if checkpoint is None:
        return False
    ckpt = read_checkpoint(checkpoint)
    state.load_state_dict(ckpt, source=str(checkpoint))
    p = state.progress
    if _schedule_length(ckpt["config"].get("trainer") or {}) != _schedule_length(state.config["trainer"]):
        state.scheduler = refit_schedule(state.optimizer, build_schedule, p.step)
        log.info("the run's length changed: LR schedule fitted to it (lr now %.4g at step %d)",
                 state.optimizer.param_groups[0]["lr"], p.step)
    log.info("resumed from %s at epoch %d, step %d, micro-batch %d", checkpoint, p.epoch, p.step, p.micro_batch)
    return True


def _evaluate(module: torch.nn.Module, *, val_loader: Any, task: Task, data: DataBundle, device: torch.device,
              amp: str, threads: int) -> dict[str, float]:
    """The exact distributed evaluation of `module` on the validation set (the same dict on every rank)."""
    return evaluate(module, val_loader, task, data.num_classes, device, amp=amp, class_names=list(data.class_names),
                    threads=threads)


def _panels(tracker: Tracker, config: TrainConfig, task: Task, data: DataBundle, device: torch.device) -> Any:
    """The task's pictures after each evaluation (rank 0, with TensorBoard)."""
    if tracker.writer is None:
        return None
    return partial(_eval_pictures, task, tracker.writer, data.val, device=device, mean=list(config.data.mean),
                   std=list(config.data.std), amp=config.trainer.amp)


def _eval_pictures(task: Task, writer: Any, dataset: Any, model: torch.nn.Module, step: int, **kwargs: Any) -> None:
    task.log_eval_pictures(writer, model, dataset, step, **kwargs)


def _close(tracker: Optional[Tracker], status: str) -> None:
    """Close TensorBoard and the tracker runs (FINISHED, KILLED or FAILED); say where TensorBoard's events are."""
    if tracker is None:
        return
    has_events = tracker.writer is not None
    tracker.close(status)
    if has_events:
        print(f"TensorBoard logs are in {tracker.tb_dir}  (view: tensorboard --logdir {tracker.tb_dir})", flush=True)
