"""`train.py`'s body: validate -> device -> process group -> run dir -> data -> model -> DDP -> epochs.

Read top to bottom, `run` is the whole recipe; each step is a call into a module that does one job.
"""
from __future__ import annotations

import inspect
import logging
import time
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from src import dist
from src.config import best_metric_of, task_of, validate_config
from src.engine import checkpoint as ckpt_io
from src.engine.accumulation import optimizer_steps_per_epoch
from src.engine.amp import build_scaler
from src.engine.ema import build_ema
from src.engine.loop import Progress, TrainParts, train_one_epoch
from src.engine.losses import build_loss
from src.engine.norm_health import check_norm_health, sync_bn_buffers
from src.engine.optim import build_optimizer, build_scheduler, trainable
from src.engine.rundir import resolve_run_dir
from src.engine.seeding import configure_determinism, configure_threads, seed_everything
from src.engine.tracking import Tracker
from src.logger import setup_logging

log = logging.getLogger("src.engine.train")


def run(cfg: DictConfig | dict) -> dict[str, float]:
    """Train as configured; returns the last validation metrics (on every rank)."""
    # Before any process group: a typo fails fast on every rank.
    cfg = validate_config(cfg, world_size=dist.launch_world_size())
    typed = OmegaConf.to_object(cfg)
    device = dist.select_device(cfg.device)
    threads = configure_threads(cfg.trainer.num_threads, dist.get_local_world_size()) if device.type == "cpu" else 0
    dist.init_distributed(device, timeout_s=cfg.trainer.dist_timeout_s)
    tracker: Optional[Tracker] = None
    try:
        run_dir = resolve_run_dir()
        setup_logging(run_dir, dist.get_rank())
        tracker = Tracker(run_dir, enabled=dist.is_main_process(), tensorboard=cfg.trainer.tensorboard)
        log.info("run dir %s | %d process(es) on %s | %s CPU threads each", run_dir, dist.get_world_size(),
                 device, threads or "-")
        if tracker.writer is not None:
            log.info("TensorBoard logs: %s  (view: tensorboard --logdir %s)", tracker.tb_dir, tracker.tb_dir)
        try:
            return _train(cfg, typed, device, run_dir, tracker)
        except RuntimeError as err:
            if not dist.is_timeout(err):
                raise
            # gloo / NCCL say only "Timed out waiting 20000ms": name the setting and the usual causes.
            raise RuntimeError(
                f"a collective waited longer than trainer.dist_timeout_s={cfg.trainer.dist_timeout_s:g} s: "
                "another rank died, hung or stalled (see its log). If steps or evaluations are legitimately "
                "that slow, raise trainer.dist_timeout_s. Checkpoints already written are intact."
            ) from err
    finally:
        if tracker is not None:
            has_events = tracker.writer is not None
            tracker.close()
            if has_events:
                print(f"TensorBoard logs are in {tracker.tb_dir}  (view: tensorboard --logdir {tracker.tb_dir})",
                      flush=True)
        dist.destroy()


def _train(cfg: DictConfig, typed: Any, device: torch.device, run_dir: Path, tracker: Tracker) -> dict[str, float]:
    rank, world = dist.get_rank(), dist.get_world_size()
    configure_determinism(cfg.trainer.deterministic)
    task = task_of(cfg)

    from src.data import build_datasets, build_eval_loader, build_train_loader
    from src.models import build_model
    from src.models.norms import NormSync

    data = build_datasets(typed.data, seed=cfg.seed)
    train_loader = build_train_loader(data.train, typed.data, rank, world, cfg.seed, drop_last=True)
    val_loader = build_eval_loader(data.val, typed.data, rank, world)

    seed_everything(cfg.seed)  # same seed on every rank before the build: identical initial weights
    model = build_model(typed.model, typed.norm, data.num_classes).to(device)
    norm_sync = NormSync(model, typed.norm, cfg.trainer.dist_timeout_s)  # collective with norm.group_size
    if cfg.trainer.channels_last:
        model = model.to(memory_format=torch.channels_last)
    seed_everything(cfg.seed + rank)  # everything random from here (dropout, MixUp) differs per rank
    check_norm_health(model, "after build", strict=False)  # DDP broadcasts rank 0's weights anyway
    wrapped = _wrap_ddp(model, cfg, device)

    accum = cfg.trainer.grad_accum_steps
    effective_batch = world * cfg.data.batch_size * accum
    steps_per_epoch = optimizer_steps_per_epoch(len(train_loader), accum)
    total_steps = steps_per_epoch * cfg.trainer.epochs
    if cfg.trainer.max_steps is not None:
        total_steps = min(total_steps, cfg.trainer.max_steps)
    optimizer = build_optimizer(model, cfg.optim, effective_batch)
    scheduler = build_scheduler(optimizer, cfg.sched, steps_per_epoch, total_steps)
    scaler = build_scaler(cfg.trainer.amp, device)
    ema = build_ema(model, cfg.trainer.ema_decay) if cfg.trainer.ema else None
    log.info("%s: %s with norm=%s, %.2fM trainable parameters; effective batch %d = %d process(es) x %d x %d "
             "accumulation; %d optimizer steps/epoch, %d in total", task, cfg.model.name, cfg.norm.name,
             trainable(model.parameters()) / 1e6, effective_batch, world, cfg.data.batch_size, accum,
             steps_per_epoch, total_steps)

    metric = best_metric_of(cfg)
    state = Progress()
    saver = ckpt_io.CheckpointSaver(run_dir, metric, cfg.trainer.keep_best)
    resume_from = _resume_path(cfg.trainer.resume, run_dir)
    if resume_from is not None:
        restored = ckpt_io.load_checkpoint(resume_from)
        _restore(restored, model, optimizer, scheduler, scaler, ema, state, saver, world * cfg.data.batch_size)
        log.info("resumed from %s at epoch %d, step %d, micro-batch %d", resume_from, state.epoch, state.step,
                 state.micro_batch)
    norm_sync.on_step(state.step)
    check_norm_health(model, "start", strict=True)

    plain_config = OmegaConf.to_container(cfg, resolve=True)

    def snapshot(metrics: dict[str, float] | None) -> dict[str, Any]:
        rng = dist.all_gather_object(ckpt_io.capture_rng_state())  # collective: every rank calls snapshot
        return {
            "model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict(), "ema": ema.state_dict() if ema is not None else None,
            "epoch": state.epoch, "step": state.step,
            "sampler": {"epoch": state.epoch, "micro_batch": state.micro_batch},
            "rng": rng, "world_size": world, "config": plain_config, "metrics": metrics or {},
        }

    def after_step(progress: Progress) -> bool:
        norm_sync.on_step(progress.step)
        every = cfg.trainer.checkpoint_every
        if every and progress.step % every == 0:
            data_state = snapshot(None)
            if dist.is_main_process():
                saver.save_last(data_state)
            dist.barrier()  # nobody runs ahead of a checkpoint a restarted job would resume from
        return progress.step >= total_steps

    parts = TrainParts(
        model=wrapped, loss_fn=build_loss(task, cfg.trainer.label_smoothing, data.ignore_index,
                                          cfg.model.aux_loss_weight),
        optimizer=optimizer, scheduler=scheduler, scaler=scaler, device=device, accum_steps=accum,
        amp=cfg.trainer.amp, channels_last=cfg.trainer.channels_last, grad_clip_norm=cfg.trainer.grad_clip_norm,
        ema=ema, mix=_build_mix(cfg, data.num_classes), log_every=cfg.trainer.log_every,
        show_progress=cfg.trainer.progress_bar and dist.is_main_process(), after_step=after_step,
        log_metrics=lambda p, m: tracker.log("train", p.epoch, p.step, m),
        log_samples=_sample_logger(tracker, cfg, task),
    )

    metrics: dict[str, float] = {}
    started = time.perf_counter()
    while state.epoch < cfg.trainer.epochs and state.step < total_steps:
        epoch = state.epoch
        _set_epoch(train_loader, data.train, epoch, state.micro_batch)
        stopped = state.micro_batch < len(train_loader) and train_one_epoch(parts, train_loader, state)
        epoch_done = state.micro_batch >= len(train_loader)
        if epoch_done:
            state.epoch, state.micro_batch = epoch + 1, 0
        last = state.epoch >= cfg.trainer.epochs or state.step >= total_steps
        if last or (epoch_done and state.epoch % cfg.trainer.eval_every == 0):
            metrics = _evaluate(cfg, model, ema, val_loader, task, data, device, tracker, state, epoch)
        data_state = snapshot(metrics)
        if dist.is_main_process():
            path = saver.save(data_state, metrics if metrics else None)
            log.info("epoch %d done at step %d (%.0fs): %s; checkpoint %s", epoch, state.step,
                     time.perf_counter() - started, _fmt(metrics), path)
        dist.barrier()
        if stopped:
            break
    tracker.flush()
    return metrics


def _wrap_ddp(model: nn.Module, cfg: DictConfig, device: torch.device) -> nn.Module:
    """DDP around the (already norm-converted) model when there is more than one process."""
    if dist.get_world_size() == 1:
        return model
    # PyTorch >= 2.14 renamed broadcast_buffers to forward_sync_buffers (buffers are still synced at init).
    sync_key = ("forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
                else "broadcast_buffers")
    return DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=cfg.trainer.ddp_bucket_cap_mb, gradient_as_bucket_view=cfg.trainer.gradient_as_bucket_view,
        **{sync_key: cfg.trainer.broadcast_buffers})


def _set_epoch(loader: Any, dataset: Any, epoch: int, start: int) -> None:
    """Tell the sampler (order) and the dataset (augmentation) the epoch; resume mid-epoch at `start`."""
    sampler = loader.batch_sampler
    sampler.set_epoch(epoch)
    sampler.set_start(start if start < len(loader) else 0)
    if hasattr(dataset, "set_epoch"):
        dataset.set_epoch(epoch)


def _evaluate(cfg: DictConfig, model: nn.Module, ema: Optional[nn.Module], loader: Any, task: str, data: Any,
              device: torch.device, tracker: Tracker, state: Progress, epoch: int) -> dict[str, float]:
    """Exact distributed evaluation of the model (and its EMA), logged as a `val` row; same dict on all ranks."""
    from src.engine.evaluator import evaluate
    from src.models.norms import per_rank_statistics

    if per_rank_statistics(cfg.norm, dist.get_world_size()) and not cfg.trainer.broadcast_buffers:
        # Per-rank statistics saw only a shard: make running stats equal before evaluating.
        sync_bn_buffers(model, cfg.trainer.norm_buffer_sync)
    check_norm_health(model, f"before evaluation at step {state.step}", strict=False)
    kwargs = dict(amp=cfg.trainer.amp, ignore_index=data.ignore_index, class_names=list(data.class_names))
    metrics = evaluate(model, loader, task, data.num_classes, device, **kwargs)
    if ema is not None:
        ema_metrics = evaluate(ema.module, loader, task, data.num_classes, device, **kwargs)
        metrics.update({f"ema_{k}": v for k, v in ema_metrics.items()})
    tracker.log("val", epoch, state.step, metrics)
    if task == "segmentation" and tracker.writer is not None:
        from src.engine.visualize import log_segmentation_panels

        log_segmentation_panels(tracker.writer, model, data.val, state.step, device, mean=cfg.data.mean,
                                std=cfg.data.std, ignore_index=data.ignore_index, amp=cfg.trainer.amp)
    return metrics


def _resume_path(resume: str, run_dir: Path) -> Optional[Path]:
    if resume == "none":
        return None
    if resume == "auto":
        found = ckpt_io.last_checkpoint(run_dir)
        if found is None:
            log.info("trainer.resume=auto: no checkpoint in %s yet, starting from scratch", run_dir)
        return found
    path = Path(resume)
    if not path.is_file():
        raise FileNotFoundError(f"trainer.resume={resume}: no such checkpoint file; use a path to a .pt file, "
                                "auto (the run dir's last checkpoint) or none")
    return path


def _restore(ckpt: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
             scaler: torch.amp.GradScaler, ema: Optional[nn.Module], state: Progress,
             saver: ckpt_io.CheckpointSaver, global_batch: int) -> None:
    """Load every piece of training state; RNG states per rank when the world size is unchanged."""
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    if ckpt.get("scaler"):
        scaler.load_state_dict(ckpt["scaler"])
    if ema is not None and ckpt.get("ema") is not None:
        ema.load_state_dict(ckpt["ema"])
    state.epoch, state.step = int(ckpt["epoch"]), int(ckpt["step"])
    state.micro_batch = int(ckpt["sampler"]["micro_batch"])
    old_global = int(ckpt.get("world_size", 1)) * int(ckpt["config"]["data"]["batch_size"])
    if old_global != global_batch and state.micro_batch:
        # Another world size or batch: resume at the same sample position of the epoch's permutation.
        state.micro_batch = state.micro_batch * old_global // global_batch
        log.warning("resuming with %d images per micro-step instead of %d: epoch position mapped to "
                    "micro-batch %d (exact only when the sizes divide)", global_batch, old_global, state.micro_batch)
    saver.best = [list(b) for b in ckpt.get("best", [])]
    rng = ckpt.get("rng") or []
    if len(rng) == dist.get_world_size():
        ckpt_io.restore_rng_state(rng[dist.get_rank()])
    else:
        log.warning("checkpoint has RNG states for %d process(es), this run has %d: RNG not restored "
                    "(data order and augmentation do not depend on it)", len(rng), dist.get_world_size())


def _build_mix(cfg: DictConfig, num_classes: int) -> Optional[Any]:
    """MixUp and/or CutMix from torchvision.transforms.v2 (one of them per batch when both are on)."""
    t = cfg.trainer
    if t.mixup_alpha <= 0 and t.cutmix_alpha <= 0:
        return None
    from torchvision.transforms import v2

    choices = []
    if t.mixup_alpha > 0:
        choices.append(v2.MixUp(alpha=t.mixup_alpha, num_classes=num_classes))
    if t.cutmix_alpha > 0:
        choices.append(v2.CutMix(alpha=t.cutmix_alpha, num_classes=num_classes))
    return choices[0] if len(choices) == 1 else v2.RandomChoice(choices)


def _sample_logger(tracker: Tracker, cfg: DictConfig, task: str) -> Optional[Any]:
    """Logs a grid of the first training batch to TensorBoard (rank 0, classification)."""
    if tracker.writer is None or task != "classification":
        return None
    from src.engine.visualize import log_classification_grid

    def log_samples(progress: Progress, images: torch.Tensor, targets: torch.Tensor) -> None:
        log_classification_grid(tracker.writer, images[:32].cpu(), progress.step, targets=targets[:32].cpu(),
                                mean=list(cfg.data.mean), std=list(cfg.data.std))

    return log_samples


def _fmt(metrics: dict[str, float]) -> str:
    keys = [k for k in ("loss", "top1", "top5", "miou", "pixel_acc", "ema_top1", "ema_miou") if k in metrics]
    return ", ".join(f"{k}={metrics[k]:.4g}" for k in keys) or "not evaluated"
