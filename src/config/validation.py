"""validate_config(): a composed config merged into the schema and every check run, before any process group starts,
so a typo fails fast on every rank with a message that names the key instead of hanging a job; the run's task is
resolved here, once (TrainConfig.resolved_task hands it down)."""
from __future__ import annotations

from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from src.config.schema import DEVICES, TrainConfig, task_options, train_schema
from src.data import DATASETS
from src.dataclass_config import foreign_settings
from src.errors import UserError, closest_name
from src.local_gpus import check_processes_fit_gpus
from src.models.config import check_model_norm
from src.models.registry import MODELS, model_family
from src.tasks import Task, resolve_task


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


def best_metric_of(cfg: TrainConfig) -> str:
    """The metric that ranks best-k checkpoints (resolves trainer.best_metric=auto)."""
    if cfg.trainer.best_metric != "auto":
        return cfg.trainer.best_metric
    return cfg.resolved_task.default_metric
