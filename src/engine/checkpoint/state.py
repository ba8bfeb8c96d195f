"""TrainState: everything a run is made of between two optimizer steps, and the checkpoint format.

`TrainState.state_dict()` / `load_state_dict()` are the only definition of what a checkpoint holds, and
this module is the only one that reads its keys: `read_checkpoint`, `stored_config`, `model_weights`,
`trained_epoch`, `trained_step` and `stored_class_names` are how a trained run is read back
(src/commands/trained_run.py, for evaluate.py, predict.py and export).

Format (version FORMAT_VERSION; files without `format_version` are version 0, identical but for that key):

    format_version  int
    model           state_dict of the unwrapped model (loads into any norm: syncbn <-> bn)
    optimizer, scheduler, scaler   their state_dicts (scaler: {} when fp16 is off)
    ema             AveragedModel state_dict ("module.<name>" keys + "n_averaged"), or None
    epoch, step     the epoch in progress (the next one at an epoch's end), optimizer steps done
    sampler         {"epoch", "micro_batch"}: where the epoch's micro-batches resume
    rng             one capture_rng_state() per rank, in rank order
    world_size      processes of the run that wrote it
    config          the resolved training config, a plain dict
    metrics         the evaluation of exactly these weights ({} when they were not evaluated)
    best            [[value, file name], ...]: the best-k checkpoints, best first
    class_names     the training data's class names in label order (predict.py names predictions with them)
    trackers        {tracker name: {"run_id", ...}}: the experiment-tracker runs a resume continues ({} if none)
    early_stop      trainer.early_stop's state (src/engine/early_stop.py: best, bad_evaluations, stopped, ...)

Checkpoints written before `trackers` and `early_stop` existed load with both empty. A stored config from
before the trackers' group was renamed holds its settings under `logger`: it is read as `tracker`.

Everything is a tensor, number, string, None or a container of those, so torch.load(weights_only=True)
reads it: loading a checkpoint never runs pickled code.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from src import comm
from src.config import RENAMED_GROUPS
from src.engine.checkpoint.files import load_checkpoint
from src.engine.seeding import capture_rng_state, restore_rng_state
from src.errors import UserError

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
# Model keys that only say where initial weights came from: not part of what a checkpoint was trained as.
_INIT_ONLY_KEYS = ("weights", "backbone_weights", "weights_strict", "pretrained")


@dataclass
class Progress:
    """Where training stands: the epoch in progress, optimizer steps done, next micro-batch of the epoch."""

    epoch: int = 0
    step: int = 0
    micro_batch: int = 0


@dataclass
class TrainState:
    """The model (unwrapped), its optimizer, LR schedule, GradScaler and EMA, progress, best-k list, config."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    ema: Optional[torch.optim.swa_utils.AveragedModel] = None
    config: dict[str, Any] = field(default_factory=dict)  # resolved, plain: stored in every checkpoint
    progress: Progress = field(default_factory=Progress)
    best: list[list] = field(default_factory=list)  # [[value, file name], ...], best first
    # Metrics of an evaluation of exactly the current weights; cleared by every optimizer step.
    metrics: dict[str, float] = field(default_factory=dict)
    class_names: list[str] = field(default_factory=list)  # the data's, in label order
    # Rank 0's tracker thread fills it as tracker runs open (src/engine/trackers/background.py).
    trackers: dict[str, dict[str, str]] = field(default_factory=dict)
    early_stop: dict[str, Any] = field(default_factory=dict)  # EarlyStopState.to_dict()

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint of this state. A collective: every rank calls it (RNG states are gathered)."""
        p = self.progress
        return {
            "format_version": FORMAT_VERSION,
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(),
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "epoch": p.epoch, "step": p.step, "sampler": {"epoch": p.epoch, "micro_batch": p.micro_batch},
            "rng": comm.all_gather_object(capture_rng_state()), "world_size": comm.get_world_size(),
            "config": self.config, "metrics": dict(self.metrics), "best": [list(b) for b in self.best],
            "class_names": list(self.class_names),
            "trackers": {k: dict(v) for k, v in dict(self.trackers).items()},  # a copy: the tracker thread adds to it
            "early_stop": dict(self.early_stop),
        }

    def load_state_dict(self, ckpt: dict[str, Any], source: str = "the checkpoint") -> None:
        """Restore every piece of a checkpoint; RNG states per rank when the world size is unchanged.

        Weights of another model, task or class count are refused with both configs named.
        """
        ckpt = upgrade(ckpt, source)
        load_model_weights(self.model, ckpt["model"], ckpt["config"], self.config, source)
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.scheduler.load_state_dict(ckpt["scheduler"])
        if ckpt.get("scaler"):
            self.scaler.load_state_dict(ckpt["scaler"])
        if self.ema is not None:
            if ckpt.get("ema") is None:  # its first update copies the resumed weights (n_averaged == 0)
                log.warning("%s holds no EMA weights (trained with trainer.ema=false): the EMA starts from the "
                            "resumed weights", source)
            else:
                self.ema.load_state_dict(ckpt["ema"])
        self.progress = Progress(int(ckpt["epoch"]), int(ckpt["step"]), int(ckpt["sampler"]["micro_batch"]))
        self._map_sampler_position(ckpt)
        self.best = [list(b) for b in ckpt.get("best", [])]
        self.metrics = {}
        self.trackers.clear()  # the same dict object: the Tracker may hold it already
        self.trackers.update({k: dict(v) for k, v in (ckpt.get("trackers") or {}).items()})
        self.early_stop = dict(ckpt.get("early_stop") or {})
        rng = ckpt.get("rng") or []
        if len(rng) == comm.get_world_size():
            restore_rng_state(rng[comm.get_rank()])
        else:
            log.warning("%s has RNG states for %d process(es), this run has %d: RNG not restored "
                        "(data order and augmentation do not depend on it)", source, len(rng),
                        comm.get_world_size())

    def _map_sampler_position(self, ckpt: dict[str, Any]) -> None:
        """With another world size or batch size, resume at the same sample position of the epoch."""
        old_global = int(ckpt.get("world_size", 1)) * int(ckpt["config"]["data"]["batch_size"])
        new_global = comm.get_world_size() * int(self.config["data"]["batch_size"])
        p = self.progress
        if old_global != new_global and p.micro_batch:
            p.micro_batch = p.micro_batch * old_global // new_global
            log.warning("resuming with %d images per micro-step instead of %d: epoch position mapped to "
                        "micro-batch %d (exact only when the sizes divide)", new_global, old_global, p.micro_batch)


def upgrade(ckpt: dict[str, Any], source: str) -> dict[str, Any]:
    """`ckpt` in the current format: version 0 (no version key) gains it, renamed config keys get their new
    names (RENAMED_GROUPS); a newer version is an error."""
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("config"), dict) or "model" not in ckpt:
        raise UserError(f"{source} is not a SyncTrain checkpoint (no 'config'/'model' entries); "
                        "pass a file from <run dir>/checkpoints/")
    version = int(ckpt.get("format_version", 0))
    if version > FORMAT_VERSION:
        raise UserError(f"{source} has checkpoint format {version}, newer than this code's {FORMAT_VERSION}: "
                        "update SyncTrain to read it")
    return {**ckpt, "format_version": FORMAT_VERSION, "config": _renamed_config_keys(ckpt["config"])}


def _renamed_config_keys(config: dict[str, Any]) -> dict[str, Any]:
    """`config` with every renamed group's old key under its new name (a new key, if present, wins), so runs
    finished before a rename still evaluate, predict, export and resume."""
    renamed = {k: v for k, v in config.items() if k not in RENAMED_GROUPS}
    for old, new in RENAMED_GROUPS.items():
        if old in config:
            renamed.setdefault(new, config[old])
    return renamed


def read_checkpoint(path: str | Path, mmap: bool = False) -> dict[str, Any]:
    """A checkpoint file in the current format (on the CPU); errors name the file. mmap=True: tensors mapped, not
    read (a cheap look at its config and progress)."""
    return upgrade(load_checkpoint(path, map_location="cpu", mmap=mmap), str(path))


def stored_config(ckpt: dict[str, Any]) -> dict[str, Any]:
    """The training config a checkpoint was written with (plain dict, without Hydra's own node)."""
    return {k: v for k, v in ckpt["config"].items() if k != "hydra"}


def model_weights(ckpt: dict[str, Any], ema: bool, source: str) -> dict[str, torch.Tensor]:
    """The model state_dict to evaluate or predict with: the trained weights, or their EMA with ema=True."""
    if not ema:
        return ckpt["model"]
    state = ckpt.get("ema")
    if not state:
        raise UserError(f"ema=true but {source} holds no EMA weights (it was trained with trainer.ema=false); "
                        "drop ema=true to evaluate the trained weights")
    # AveragedModel keys its copy as "module.<name>" and adds its step counter "n_averaged".
    return {k.removeprefix("module."): v for k, v in state.items() if k != "n_averaged"}


def trained_epoch(ckpt: dict[str, Any]) -> int | None:
    """The epoch the checkpoint's last optimizer step belongs to: what metrics.jsonl's val row calls `epoch`.

    An end-of-epoch checkpoint stores the epoch to run next (micro-batch 0), a mid-epoch one the current.
    """
    epoch = ckpt.get("epoch")
    if epoch is None:
        return None
    at_epoch_start = (ckpt.get("sampler") or {}).get("micro_batch", 0) == 0
    return int(epoch) - 1 if at_epoch_start and int(epoch) > 0 else int(epoch)


def trained_step(ckpt: dict[str, Any]) -> int | None:
    """Optimizer steps done when the checkpoint was written."""
    step = ckpt.get("step")
    return None if step is None else int(step)


def stored_class_names(ckpt: dict[str, Any]) -> list[str]:
    """The training data's class names in label order; [] for checkpoints written before they were stored."""
    return [str(name) for name in ckpt.get("class_names") or []]


def load_model_weights(model: nn.Module, weights: dict[str, torch.Tensor], stored: dict[str, Any],
                       current: dict[str, Any], source: str) -> None:
    """Load checkpoint weights into `model` (strict); a mismatch names the settings that differ (UserError)."""
    try:
        model.load_state_dict(weights, strict=True)
    except RuntimeError:  # other keys or shapes: another model, task or number of classes
        raise UserError(f"the weights in {source} do not fit this model: {_mismatch(model, weights, stored, current)}"
                        ". Use the checkpoint's settings (leave those overrides out), or another checkpoint") from None


# Norms whose layers have BatchNorm's state_dict keys: a checkpoint moves freely between them.
_BATCHNORM_LAYOUT = ("bn", "syncbn", "torch_syncbn")


def _mismatch(model: nn.Module, weights: dict[str, torch.Tensor], stored: dict[str, Any],
              current: dict[str, Any]) -> str:
    """The settings that shape the weights and differ, each named once; else the tensors that differ."""
    before, after = _weight_settings(stored), _weight_settings(current)
    differ = [k for k in {**before, **after} if before.get(k) != after.get(k)]
    if differ:
        return (f"the checkpoint was trained with {', '.join(f'{k}={before.get(k)}' for k in differ)}; this run has "
                f"{', '.join(f'{k}={after.get(k)}' for k in differ)}")
    own = model.state_dict()
    kinds = [("missing from the checkpoint", [k for k in own if k not in weights], ""),
             ("not in this model", [k for k in weights if k not in own], ""),
             ("of another shape", [k for k in own if k in weights and own[k].shape != weights[k].shape], "shape")]
    parts = []
    for label, keys, shape in kinds:
        if keys:
            first = keys[0]
            example = (f"{first}: {tuple(weights[first].shape)} in the checkpoint, {tuple(own[first].shape)} here"
                       if shape else first)
            parts.append(f"{len(keys)} tensor(s) {label} (e.g. {example})")
    return "the same settings, but " + "; ".join(parts)


def _weight_settings(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config values that decide a model's state_dict keys and shapes, flattened (model.*, norm, data)."""
    model = {f"model.{k}": v for k, v in (cfg.get("model") or {}).items() if k not in _INIT_ONLY_KEYS}
    norm = (cfg.get("norm") or {}).get("name")
    data = cfg.get("data") or {}
    return {**model, "norm.name": "bn" if norm in _BATCHNORM_LAYOUT else norm, "data.name": data.get("name"),
            "data.num_classes": data.get("num_classes")}
