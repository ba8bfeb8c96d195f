"""Top-level structured config: the schema conf/train.yaml is checked against, and validate_config().

The data, model and norm groups own their dataclasses (src/data/config.py, src/models/config.py);
this module owns optim/sched/trainer and the top level, adds the tasks' own keys to the groups they extend
(Task.config_options) when the schema is first needed (`train_schema`, once the registries are loaded: importing
this module imports no task), registers it in Hydra's ConfigStore as `train_schema` (`register_train_schema`, which
train.py's body calls), resolves the run's task, and runs every check before any process group starts, so a typo
fails fast on every rank with a message that names the key instead of hanging a job.
"""
from __future__ import annotations

import dataclasses
import functools
import re
import signal
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from src.data import DATASETS
from src.data.config import DataConfig, data_schema
from src.dataclass_config import Owned, extend, foreign_settings
from src.errors import UserError, closest_name
from src.local_gpus import check_processes_fit_gpus
from src.models.config import ModelConfig, NormConfig, check_model_norm, model_schema
from src.models.registry import MODELS, model_family
from src.tasks import Task, all_tasks, resolve_task
from src.tracker_config import TrackerConfig

OPTIMIZERS = ("sgd", "adamw")
SCHEDULES = ("cosine", "step", "poly")
AMP_MODES = ("none", "bf16", "fp16")
DTYPES = ("float32", "float64")
DEVICES = ("auto", "cpu", "cuda")
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
        _one_of("optim.name", self.name, OPTIMIZERS)
        _positive("optim.lr", self.lr)
        if self.reference_batch_size is not None:
            _positive("optim.reference_batch_size", self.reference_batch_size)
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"optim.momentum must be in [0, 1), got {self.momentum}")
        if self.nesterov and (self.name != "sgd" or self.momentum == 0):
            raise ValueError("optim.nesterov=true needs optim.name=sgd and optim.momentum > 0")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"optim.betas must be two numbers in [0, 1), got {list(self.betas)}")
        _positive("optim.eps", self.eps)
        _non_negative("optim.weight_decay", self.weight_decay)
        _positive("optim.head_lr_mult", self.head_lr_mult)


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
        _one_of("sched.name", self.name, SCHEDULES)
        _non_negative("sched.warmup_epochs", self.warmup_epochs)
        if not 0.0 < self.warmup_start_factor <= 1.0:
            raise ValueError(f"sched.warmup_start_factor must be in (0, 1], got {self.warmup_start_factor}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"sched.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        _positive("sched.step_epochs", self.step_epochs)
        if list(self.milestones) != sorted(set(self.milestones)) or any(m <= 0 for m in self.milestones):
            raise ValueError(f"sched.milestones must be increasing positive epochs, got {list(self.milestones)}")
        _positive("sched.gamma", self.gamma)
        _positive("sched.power", self.power)


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
        _positive("trainer.epochs", self.epochs)
        if self.max_steps is not None:
            _positive("trainer.max_steps", self.max_steps)
        _positive("trainer.grad_accum_steps", self.grad_accum_steps)
        _one_of("trainer.amp", self.amp, AMP_MODES)
        _one_of("trainer.dtype", self.dtype, DTYPES)
        if self.dtype == "float64" and self.amp != "none":
            raise ValueError(f"trainer.dtype=float64 with trainer.amp={self.amp}: autocast would compute in "
                             f"{self.amp}, not float64; set trainer.amp=none (or trainer.dtype=float32)")
        if self.grad_clip_norm is not None:
            _positive("trainer.grad_clip_norm", self.grad_clip_norm)
        if not 0.0 < self.ema_decay < 1.0:
            raise ValueError(f"trainer.ema_decay must be in (0, 1), got {self.ema_decay}")
        _positive("trainer.eval_every", self.eval_every)
        _positive("trainer.log_every", self.log_every)
        _non_negative("trainer.checkpoint_every", self.checkpoint_every)
        _non_negative("trainer.keep_best", self.keep_best)
        if not self.resume:
            raise ValueError("trainer.resume must be none, auto or a checkpoint path, got an empty string")
        _positive("trainer.dist_timeout_s", self.dist_timeout_s)
        _positive("trainer.dist_init_timeout_s", self.dist_init_timeout_s)
        parse_signals(self.preempt_signals)
        _positive("trainer.ddp_bucket_cap_mb", self.ddp_bucket_cap_mb)
        _one_of("trainer.norm_buffer_sync", self.norm_buffer_sync, BUFFER_SYNC)
        _one_of("trainer.compile_mode", self.compile_mode, COMPILE_MODES)
        _non_negative("trainer.num_threads", self.num_threads)
        _non_negative_int("trainer.eval_num_threads", self.eval_num_threads)
        _non_negative_int("trainer.precise_bn_batches", self.precise_bn_batches)
        _non_negative_int("trainer.precise_bn_every", self.precise_bn_every)
        if self.precise_bn_every and not self.precise_bn_batches:
            raise ValueError(f"trainer.precise_bn_every={self.precise_bn_every} needs trainer.precise_bn_batches > 0 "
                             "(the number of training batches per process to recompute BatchNorm statistics on)")


def task_options(group: str) -> list[Owned]:
    """(task name, its option dataclass) of every registered task that adds keys to config group `group`."""
    return [(task.name, task.config_options[group]) for task in all_tasks() if group in task.config_options]


def data_config(**values: Any) -> DataConfig:
    """A `data` group config with every dataset's and task's options (for code and tests that build one)."""
    return _group_schemas()["data"](**values)


@dataclass
class TrainConfig:
    """Everything `train.py` reads; `hydra` is Hydra's own node and is not part of this schema. The groups here are
    their core keys; train_schema() is this with every owner's options added, the class validate_config returns."""

    seed: int = 0
    device: str = "auto"
    # The run's task (src/tasks/): null = the one that model.name and data.name have in common; a task's name
    # chooses where they share several. validate_config sets it to the resolved task's name.
    task: Optional[str] = None
    model: ModelConfig = field(default_factory=ModelConfig)
    norm: NormConfig = field(default_factory=NormConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    sched: SchedConfig = field(default_factory=SchedConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    # Experiment trackers (conf/tracker/); conf/train.yaml selects tracker=tensorboard by default.
    tracker: TrackerConfig = field(default_factory=TrackerConfig)

    @property
    def resolved_task(self) -> Task:
        """The run's Task object, resolved once by validate_config (the `task` key holds its name)."""
        task = self.__dict__.get("_task")
        if task is None:
            raise ValueError("this TrainConfig did not come from validate_config, which resolves the run's task: "
                             "pass it through src.config.validate_config first")
        return task


@functools.lru_cache(maxsize=None)
def _group_schemas() -> dict[str, type]:
    """The groups' schemas: each core dataclass with the options its owners declare in their own files (the tasks'
    src/tasks/<task>/options.py, the datasets' and model families' registrations): src/dataclass_config.py. Built
    on first use, when reading the task registry loads the tasks."""
    return {"model": model_schema(), "data": extend(data_schema(), task_options("data")),
            "trainer": extend(TrainerConfig, task_options("trainer"))}


@functools.lru_cache(maxsize=None)
def train_schema() -> type[TrainConfig]:
    """TrainConfig with every registered task's, dataset's and model family's keys in its groups: what
    conf/train.yaml composes onto and validate_config checks against."""
    fields = [(group, schema, field(default_factory=schema)) for group, schema in _group_schemas().items()]
    schema = dataclasses.make_dataclass("TrainConfig", fields, bases=(TrainConfig,))
    schema.__module__, schema.__doc__ = __name__, TrainConfig.__doc__
    return schema


def register_train_schema() -> None:
    """Store train_schema() in Hydra's ConfigStore as `train_schema`, the first entry of conf/train.yaml's defaults:
    train.py's body (src/commands/train.py) calls it when imported, as must other code composing conf/train.yaml."""
    ConfigStore.instance().store(name="train_schema", node=train_schema())


# Config groups renamed since runs were made with them: old name -> new name. The command line is checked
# (refuse_renamed_groups) and a checkpoint's stored config is read with the new names
# (src/engine/checkpoint/state.py), so old runs still evaluate, predict and resume.
RENAMED_GROUPS = {"logger": "tracker"}
# What each new group holds, with examples, for the message that refuses the old name.
_RENAMED_HINTS = {"tracker": "the trackers' config group is now `tracker` (tracker=tensorboard, "
                             "tracker=[tensorboard,mlflow], tracker.mlflow.experiment=NAME)"}
# An override's group or top-level key: `logger=x`, `logger.a.b=x`, `+logger=x`, `++logger.a=x`, `~logger`,
# `logger@pkg=x`.
_OVERRIDE_KEY = re.compile(r"^(?:~|\+\+|\+)?([A-Za-z_]\w*)(?=[.=@]|$)")


def refuse_renamed_groups(argv: Sequence[str]) -> None:
    """Raise UserError naming the new group when an override uses a renamed one.

    The entry points' command-line check (src/commands/command_line.py) calls it before Hydra composes anything,
    so neither Hydra's "Could not find 'logger'" nor a process group comes first.
    """
    for arg in argv:
        match = _OVERRIDE_KEY.match(arg)
        new = RENAMED_GROUPS.get(match.group(1)) if match else None
        if new is not None:
            old = match.group(1)
            fixed = arg[:match.start(1)] + new + arg[match.end(1):]
            raise UserError(f"{arg}: {_RENAMED_HINTS.get(new, f'the config group is now `{new}`')}; "
                            f"rename {old}... to {new}... (here: {fixed})")


def validate_config(cfg: DictConfig | dict[str, Any], *, world_size: Optional[int] = None) -> TrainConfig:
    """Merge `cfg` into the schema (unknown keys and wrong types rejected), run every check; return it typed.

    The TrainConfig returned is the one config the run uses from here on; `config_dict` derives the plain
    dict a checkpoint stores from it.

    Raises UserError (a ValueError) whose message names the offending key. Call it before init_distributed.
    world_size: the number of training processes, for checks that depend on it (norm.group_size); None skips
    them (evaluation, which never synchronises BatchNorm statistics).
    """
    try:
        return _checked_config(cfg, world_size)
    except UserError:
        raise
    except ValueError as err:  # the checks below (and the groups' own) raise ValueError: the user's config
        raise UserError(str(err)) from err


def _checked_config(cfg: DictConfig | dict[str, Any], world_size: Optional[int]) -> TrainConfig:
    """validate_config's checks, in order."""
    # As a plain container: Hydra composes onto the schema and `+trainer.foo=1` force-adds a key to it, and
    # merging that typed node into the schema would copy the key along instead of checking it.
    plain = dict(cfg) if isinstance(cfg, dict) else OmegaConf.to_container(cfg, resolve=False)
    plain.pop("hydra", None)  # a config loaded from .hydra/ or composed with return_hydra_config
    raw = OmegaConf.create(plain)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(train_schema()), raw)
        OmegaConf.resolve(merged)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "?"
        hint = (f"{_did_you_mean(key)} (no such setting: check its spelling; `python train.py --cfg job` prints "
                "every key)" if isinstance(exc, ConfigKeyError) else "")
        msg = str(exc.msg if hasattr(exc, "msg") else exc).splitlines()[0]  # the rest repeats the key and types
        raise ValueError(f"invalid config key {key!r}: {msg}{hint}") from None
    typed: TrainConfig = OmegaConf.to_object(merged)  # type: ignore[assignment]
    if typed.device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {typed.device!r}")
    if world_size is not None:  # a training launch: one GPU per local process (src/local_gpus.py)
        check_processes_fit_gpus(typed.device)
    if typed.model.name in MODELS and typed.data.name in DATASETS:
        _resolve_task(typed)  # a model and a dataset of no common task: said first, before either's options
    for part in (typed.model, typed.data, typed.optim, typed.sched, typed.trainer, typed.tracker):
        part.validate()
    # torch_syncbn needs CUDA + NCCL, norm.group_size must divide the number of processes: refused here,
    # not at the first forward.
    typed.norm.validate(typed.device, world_size=world_size)
    check_model_norm(typed.model, typed.norm)
    task = _resolve_task(typed)
    typed.task, typed.__dict__["_task"] = task.name, task  # once; config.resolved_task hands it down
    _check_across_groups(typed)
    return typed


def _did_you_mean(key: str) -> str:
    """"; did you mean trainer.max_steps?" for trainer.max_step: the closest key of the same section, if any."""
    parent, _, leaf = key.rpartition(".")
    schema = OmegaConf.structured(train_schema())
    node = OmegaConf.select(schema, parent) if parent else schema
    close = closest_name(leaf, [str(k) for k in node.keys()] if isinstance(node, DictConfig) else [])
    return f"; did you mean {'.'.join(filter(None, [parent, close]))}?" if close else ""


def config_dict(config: TrainConfig) -> dict[str, Any]:
    """The resolved config as a plain dict, in the schema's key order: what checkpoints store as `config`."""
    return OmegaConf.to_container(OmegaConf.structured(config), resolve=True)  # type: ignore[return-value]


def best_metric_of(cfg: TrainConfig) -> str:
    """The metric that ranks best-k checkpoints (resolves trainer.best_metric=auto)."""
    if cfg.trainer.best_metric != "auto":
        return cfg.trainer.best_metric
    return cfg.resolved_task.default_metric


def _resolve_task(cfg: TrainConfig) -> Task:
    """The task model.name and data.name have in common, or `task=` where they share several (src/tasks/registry.py);
    UserError naming both otherwise."""
    if cfg.task is not None and not isinstance(cfg.task, str):
        raise UserError(f"task must be a task's name or null, got {cfg.task!r}")
    return resolve_task(cfg.model.name, cfg.data.name, cfg.task)


def _check_task_options(cfg: TrainConfig) -> None:
    """Another task's option set away from its default is refused: nothing in this run would read it. The message
    names the key and this run first, its owners last, so that a new owner of the key changes only its end."""
    task = cfg.resolved_task
    for group in ("data", "trainer"):
        for key, value, owners in foreign_settings(getattr(cfg, group), task_options(group), {task.name}):
            raise UserError(f"{group}.{key}={value!r} is not read by this run's task, {task.name} "
                            f"(model={cfg.model.name}, data={cfg.data.name}): it is an option of "
                            f"{' and '.join(owners)}; remove it")


def _check_across_groups(cfg: TrainConfig) -> None:
    task, name = cfg.resolved_task, cfg.resolved_task.name
    _check_task_options(cfg)
    metric = best_metric_of(cfg)
    if metric not in task.metrics:
        raise ValueError(f"trainer.best_metric={metric!r} is not a {name} metric; use one of {tuple(task.metrics)} "
                         "or auto")
    cfg.trainer.early_stop.validate(task, ema=cfg.trainer.ema)
    task.validate(cfg)
    if cfg.device == "cpu" and cfg.trainer.amp == "fp16":
        raise ValueError("trainer.amp=fp16 needs a GPU; on the CPU use trainer.amp=bf16 or none")
    if cfg.trainer.precise_bn_batches and cfg.norm.name in ("gn", "frozen_bn"):
        why = ("GroupNorm has no running statistics" if cfg.norm.name == "gn"
               else "frozen BatchNorm keeps its (pretrained) statistics by design")
        raise ValueError(f"trainer.precise_bn_batches={cfg.trainer.precise_bn_batches} with norm={cfg.norm.name}: "
                         f"{why}, so there is nothing to recalibrate; set trainer.precise_bn_batches=0 or use "
                         "norm=bn or norm=syncbn")
    if cfg.trainer.compile:
        _check_compilable(cfg)
    if cfg.trainer.activation_checkpointing:
        _check_checkpointable(cfg)


def _check_checkpointable(cfg: TrainConfig) -> None:
    """trainer.activation_checkpointing's limits, refused before any process starts."""
    if cfg.trainer.compile:
        raise ValueError(
            "trainer.activation_checkpointing=true cannot be combined with trainer.compile=true: BatchNorm's "
            "recomputation reuses the first forward's statistics through Python bookkeeping that torch.compile "
            "does not trace, so a compiled recomputation would repeat SyncBN's collective and update the running "
            "statistics twice; use one of the two"
        )
    family = model_family(cfg.model.name)
    if family.checkpoint_stages is None:
        raise UserError(f"trainer.activation_checkpointing=true: the stages of model={cfg.model.name} ({family.name} "
                        "models) are not known to the trainer; set trainer.activation_checkpointing=false")
    if family.checkpoint_check is not None:  # e.g. which of a library's architectures have known stages
        family.checkpoint_check(cfg.model)


def _check_compilable(cfg: TrainConfig) -> None:
    """Options torch.compile cannot trace, refused before any process starts compiling."""
    norm = cfg.norm
    # Their schedule is Python state that changes between training forwards (a forward counter seeded by
    # a host read of num_batches_tracked, the optimizer step): Dynamo would break the graph or recompile
    # at every step until its recompile limit.
    for key, value, off in (("sync_every", norm.sync_every, 1), ("sync_until_step", norm.sync_until_step, None)):
        if value != off:
            raise ValueError(
                f"trainer.compile=true cannot compile norm.{key}={value}: that schedule is Python state that "
                f"changes between steps, so torch.compile would break the graph or recompile at every step; "
                f"use trainer.compile=false with it, or norm.{key}={'null' if off is None else off}"
            )


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


def _one_of(key: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{key} must be one of {list(allowed)}, got {value!r}")


def _positive(key: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{key} must be > 0, got {value}")


def _non_negative_int(key: str, value: Any) -> None:
    """An int >= 0 (a TrainerConfig built in code skips OmegaConf's type check, so the type is checked too)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be a whole number >= 0, got {value!r}")
    _non_negative(key, value)


def _non_negative(key: str, value: float) -> None:
    if not value >= 0:
        raise ValueError(f"{key} must be >= 0, got {value}")
