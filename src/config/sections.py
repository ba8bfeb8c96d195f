"""The config sections this package owns: optim, sched and trainer (with trainer.early_stop), their allowed values
and their own checks. The data, model and norm groups own their dataclasses (src/data/config.py,
src/models/config.py), the tracker group is src/config/tracker.py."""
from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

from src.config.checks import non_negative, non_negative_int, one_of, positive
from src.tasks import Task

OPTIMIZERS = ("sgd", "adamw")
SCHEDULES = ("cosine", "step", "poly")
AMP_MODES = ("none", "bf16", "fp16")
DTYPES = ("float32", "float64")
BUFFER_SYNC = ("reduce", "broadcast", "none")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")  # torch.compile's mode= (default: None)


@dataclass
class OptimConfig:
    """Optimizer (torch.optim.SGD or AdamW) and its parameter groups."""

    name: str = "sgd"
    lr: float = 0.1
    # When set, lr is for this many images and is scaled by effective_batch / reference_batch_size.
    reference_batch_size: Optional[int] = None
    momentum: float = 0.9
    nesterov: bool = False
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    weight_decay: float = 5e-4
    exclude_bias_and_norm_from_weight_decay: bool = True
    head_lr_mult: float = 1.0
    # One fused kernel per step instead of a Python loop over parameters (torch.optim's `fused=`):
    # null = wherever torch supports it for the model's parameters (CPU and CUDA floats), true = required
    # (an error if unsupported), false = torch's default implementation.
    fused: Optional[bool] = None

    def validate(self) -> None:
        """Raise ValueError naming the first bad key."""
        one_of("optim.name", self.name, OPTIMIZERS)
        positive("optim.lr", self.lr)
        if self.reference_batch_size is not None:
            positive("optim.reference_batch_size", self.reference_batch_size)
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"optim.momentum must be in [0, 1), got {self.momentum}")
        if self.nesterov and (self.name != "sgd" or self.momentum == 0):
            raise ValueError("optim.nesterov=true needs optim.name=sgd and optim.momentum > 0")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"optim.betas must be two numbers in [0, 1), got {list(self.betas)}")
        positive("optim.eps", self.eps)
        non_negative("optim.weight_decay", self.weight_decay)
        positive("optim.head_lr_mult", self.head_lr_mult)


@dataclass
class SchedConfig:
    """LR schedule from torch.optim.lr_scheduler, stepped once per optimizer step."""

    name: str = "cosine"
    warmup_epochs: float = 0.0
    warmup_start_factor: float = 0.1
    min_lr_ratio: float = 0.0  # cosine: eta_min = lr * min_lr_ratio
    step_epochs: int = 30  # step: StepLR period in epochs
    milestones: List[int] = field(default_factory=list)  # step: MultiStepLR epochs (overrides step_epochs)
    gamma: float = 0.1  # step: LR factor at each step
    power: float = 0.9  # poly: PolynomialLR power

    def validate(self) -> None:
        """Raise ValueError naming the first bad key."""
        one_of("sched.name", self.name, SCHEDULES)
        non_negative("sched.warmup_epochs", self.warmup_epochs)
        if not 0.0 < self.warmup_start_factor <= 1.0:
            raise ValueError(f"sched.warmup_start_factor must be in (0, 1], got {self.warmup_start_factor}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"sched.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        positive("sched.step_epochs", self.step_epochs)
        if list(self.milestones) != sorted(set(self.milestones)) or any(m <= 0 for m in self.milestones):
            raise ValueError(f"sched.milestones must be increasing positive epochs, got {list(self.milestones)}")
        positive("sched.gamma", self.gamma)
        positive("sched.power", self.power)


EARLY_STOP_MODES = ("max", "min", "auto")


@dataclass
class EarlyStopConfig:
    """`trainer.early_stop`: off while `metric` is null."""

    # A validation metric as metrics.jsonl's val rows name it (top1, miou, loss, ema_top1, iou_<class>),
    # optionally written with TensorBoard's prefix: val/top1.
    metric: Optional[str] = None
    mode: str = "auto"  # max | min; auto: the way the task says the metric improves (min for loss, max for top1)
    patience: int = 5  # evaluations without improvement before stopping
    min_delta: float = 0.0  # an improvement must beat the best by more than this

    def validate(self, task: Task, ema: bool) -> None:
        """Raise ValueError naming the key when the settings cannot work for this task."""
        if self.mode not in EARLY_STOP_MODES:
            raise ValueError(f"trainer.early_stop.mode must be one of {list(EARLY_STOP_MODES)}, got {self.mode!r}")
        if self.patience < 0:
            raise ValueError(f"trainer.early_stop.patience must be >= 0, got {self.patience}")
        if not self.min_delta >= 0:
            raise ValueError(f"trainer.early_stop.min_delta must be >= 0, got {self.min_delta}")
        if self.metric is None:
            return
        name = self.name
        known = list(task.metrics) + ([f"ema_{m}" for m in task.metrics] if ema else [])
        per_class = task.knows_metric(name) or (ema and name.startswith("ema_") and task.knows_metric(name[4:]))
        if name not in known and not per_class:
            extra = f" or {task.per_class_prefix}<class name>" if task.per_class_prefix else ""
            raise ValueError(f"trainer.early_stop.metric={self.metric!r} is not a validation metric of this run; "
                             f"use one of {known}{extra} (a val/ prefix is allowed)")

    @property
    def name(self) -> str:
        """The metric's key in the evaluation's dict (the val/ prefix removed)."""
        return (self.metric or "").removeprefix("val/")

    def higher_is_better(self, task: Task) -> bool:
        """mode=max, or mode=auto and `task` declares that the metric rises."""
        return self.mode == "max" or (self.mode == "auto" and task.higher_is_better(self.name))


@dataclass
class TrainerConfig:
    """The training loop: length, accumulation, precision, logging, checkpoints, distributed knobs."""

    epochs: int = 8
    max_steps: Optional[int] = None
    grad_accum_steps: int = 1
    # float64: weights, inputs, losses and optimizer state in float64 (and SyncBN's float64 kernels), to
    # verify a setup or debug a divergence without float32 rounding; needs amp=none.
    dtype: str = "float32"
    amp: str = "none"
    channels_last: bool = False
    grad_clip_norm: Optional[float] = None
    ema: bool = False
    ema_decay: float = 0.999
    eval_every: int = 1
    log_every: int = 20
    checkpoint_every: int = 0
    keep_best: int = 1
    best_metric: str = "auto"
    # none (a new run; refused in a folder that holds another run), auto (the run in hydra.run.dir, if any),
    # a run folder (continues it with its saved config), or a checkpoint file (this config, from its state).
    resume: str = "none"
    overwrite: bool = False  # a new run may replace the folder's old run, which is moved to <folder>/previous/
    deterministic: bool = False
    dist_timeout_s: float = 1800.0
    dist_init_timeout_s: float = 300.0
    # Signals that stop training after the current optimizer step with last.pt saved (src/engine/preemption.py):
    # SIGTERM (scancel, docker stop, torchrun), SIGUSR1 (sbatch --signal), SIGUSR2 (Hydra's submitit launcher).
    preempt_signals: List[str] = field(default_factory=lambda: ["SIGTERM", "SIGUSR1", "SIGUSR2"])
    ddp_bucket_cap_mb: float = 25.0
    gradient_as_bucket_view: bool = True
    broadcast_buffers: bool = False
    norm_buffer_sync: str = "reduce"
    num_threads: int = 0
    # Intra-op CPU threads of every process while it evaluates or predicts (then num_threads' count again): one
    # number for every world size, so evaluation is bitwise the same at any W (docs/evaluation.md); 0 = keep
    # num_threads' count, which depends on the processes per node.
    eval_num_threads: int = 1
    progress_bar: bool = True
    tensorboard: bool = True
    # torch.compile the forward module (after DDP wrapping); evaluation runs the same compiled model in
    # eval mode. compile_mode is torch.compile's mode (reduce-overhead adds CUDA graphs on GPUs).
    compile: bool = False
    compile_mode: str = "default"
    # Validate, form the process group, build model and data, one forward of one batch (no optimizer step,
    # nothing written), print a summary and exit 0: src/commands/dry_run.py.
    dry_run: bool = False
    # Stop when a validation metric stops improving (src/engine/early_stop.py); off while metric is null.
    early_stop: EarlyStopConfig = field(default_factory=EarlyStopConfig)
    # Recompute each stage's activations in the backward instead of keeping them (less memory, one more
    # forward of those stages): src/models/activation_checkpointing.py; BatchNorm statistics stay exact.
    activation_checkpointing: bool = False
    # Precise BatchNorm (src/engine/precise_bn.py, PreciseBNHook): before the final evaluation, recompute every
    # BatchNorm's running_mean / running_var (model and EMA) as the exact population statistics, over all ranks,
    # of this many training micro-batches per rank; 0 = off. precise_bn_every=k also recalibrates before every
    # k-th scheduled evaluation (every eval_every x k epochs); 0 = only at the end of training.
    precise_bn_batches: int = 0
    precise_bn_every: int = 0

    def validate(self) -> None:
        """Raise ValueError naming the first bad key."""
        positive("trainer.epochs", self.epochs)
        if self.max_steps is not None:
            positive("trainer.max_steps", self.max_steps)
        positive("trainer.grad_accum_steps", self.grad_accum_steps)
        one_of("trainer.amp", self.amp, AMP_MODES)
        one_of("trainer.dtype", self.dtype, DTYPES)
        if self.dtype == "float64" and self.amp != "none":
            raise ValueError(f"trainer.dtype=float64 with trainer.amp={self.amp}: autocast would compute in "
                             f"{self.amp}, not float64; set trainer.amp=none (or trainer.dtype=float32)")
        if self.grad_clip_norm is not None:
            positive("trainer.grad_clip_norm", self.grad_clip_norm)
        if not 0.0 < self.ema_decay < 1.0:
            raise ValueError(f"trainer.ema_decay must be in (0, 1), got {self.ema_decay}")
        positive("trainer.eval_every", self.eval_every)
        positive("trainer.log_every", self.log_every)
        non_negative("trainer.checkpoint_every", self.checkpoint_every)
        non_negative("trainer.keep_best", self.keep_best)
        if not self.resume:
            raise ValueError("trainer.resume must be none, auto or a checkpoint path, got an empty string")
        positive("trainer.dist_timeout_s", self.dist_timeout_s)
        positive("trainer.dist_init_timeout_s", self.dist_init_timeout_s)
        parse_signals(self.preempt_signals)
        positive("trainer.ddp_bucket_cap_mb", self.ddp_bucket_cap_mb)
        one_of("trainer.norm_buffer_sync", self.norm_buffer_sync, BUFFER_SYNC)
        one_of("trainer.compile_mode", self.compile_mode, COMPILE_MODES)
        non_negative("trainer.num_threads", self.num_threads)
        non_negative_int("trainer.eval_num_threads", self.eval_num_threads)
        non_negative_int("trainer.precise_bn_batches", self.precise_bn_batches)
        non_negative_int("trainer.precise_bn_every", self.precise_bn_every)
        if self.precise_bn_every and not self.precise_bn_batches:
            raise ValueError(f"trainer.precise_bn_every={self.precise_bn_every} needs trainer.precise_bn_batches > 0 "
                             "(the number of training batches per process to recompute BatchNorm statistics on)")


UNCATCHABLE_SIGNALS = {signal.SIGKILL, signal.SIGSTOP}


def parse_signals(names: Sequence[str], key: str = "trainer.preempt_signals") -> tuple[signal.Signals, ...]:
    """Signal names ("SIGTERM", "USR1", case-insensitive) as signals; ValueError naming `key` otherwise.

    The config's check of trainer.preempt_signals, and what src/engine/preemption.py installs handlers for."""
    parsed: list[signal.Signals] = []
    for name in names:
        text = str(name).strip().upper()
        text = text if text.startswith("SIG") else "SIG" + text
        sig = getattr(signal.Signals, text, None)
        if sig is None:
            raise ValueError(f"{key}: unknown signal {name!r}; use names such as SIGTERM, SIGUSR1, SIGUSR2, "
                             "SIGINT, SIGHUP, or [] to disable preemption handling")
        if sig in UNCATCHABLE_SIGNALS:
            raise ValueError(f"{key}: {sig.name} cannot be caught by any process; use SIGTERM or SIGUSR1")
        if sig not in parsed:
            parsed.append(sig)
    return tuple(parsed)
