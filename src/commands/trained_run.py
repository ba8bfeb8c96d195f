"""A trained run read back from one checkpoint: its typed config, task, model with weights, class names, progress.

The one reader for everything that uses a finished checkpoint (evaluate.py, predict.py, export): the path
check, the stored config with the command line's overrides, the model rebuilt from it with the norm this
machine can run, the weights (or their EMA) loaded, eval mode. Checkpoint keys are read only through
src/engine/checkpoint/state.py.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from src import process_group
from src.config import TrainConfig, config_dict, validate_config
from src.engine.checkpoint.files import checkpoint_file
from src.engine.checkpoint.state import (load_model_weights, model_weights, read_checkpoint, stored_class_names,
                                         stored_config, trained_epoch, trained_step)
from src.models import build_model
from src.precision import PRECISIONS
from src.tasks import Task

log = logging.getLogger(__name__)

# Norms whose eval-mode forward is BatchNorm's with the running statistics (F.batch_norm, the same call):
# rebuilt as nn.BatchNorm, which needs neither the compiled SyncBN kernels nor NCCL, so a checkpoint trained
# with them evaluates and predicts on any machine (the state_dict keys are the same). Only the keys
# BatchNorm reads are kept: synchronisation settings are refused for norm=bn.
BATCHNORM_IN_EVAL = ("syncbn", "torch_syncbn")
BATCHNORM_KEYS = ("eps", "momentum", "affine_trainable")


@dataclass
class TrainedRun:
    """A checkpoint made ready to run: the model is on `device`, in eval mode, with the chosen weights loaded."""

    config: TrainConfig  # the stored training config with the overrides, validated (norm as rebuilt here)
    task: Task  # the run's task (src/tasks/), as config validation resolved it
    model: nn.Module
    class_names: list[str]  # in label order; numbered "0".."N-1" for checkpoints that stored none
    epoch: Optional[int]  # the epoch its last optimizer step belongs to (metrics.jsonl's val row `epoch`)
    step: Optional[int]  # optimizer steps done
    path: Path
    weights: str  # "model" or "ema"
    device: torch.device
    trained_norm: str  # norm.name the run was trained with (the model may be rebuilt as BatchNorm)


def load_trained_run(path: str | Path, *, ema: bool = False, device: Optional[torch.device] = None,
                     overrides: Optional[Mapping[str, Any]] = None, key: str = "ckpt") -> TrainedRun:
    """Read checkpoint `path` and rebuild its model for evaluation or prediction on this machine.

    overrides: nested keys of the training config to replace (see `overrides_of`). device: where the
    model goes; None selects it from the config (`device`, cuda:LOCAL_RANK or cpu), as training does.
    key: the config key `path` came from, named in errors. Raises FileNotFoundError for a missing file,
    ValueError for a foreign file, absent EMA weights or weights that do not fit the configured model.
    """
    path = checkpoint_file(path, key)
    ckpt = read_checkpoint(path)
    stored = stored_config(ckpt)
    merged = _with_overrides(stored, overrides or {})
    trained_norm = str(OmegaConf.select(merged, "norm.name", default="bn"))
    if trained_norm in BATCHNORM_IN_EVAL:
        merged = _as_batchnorm(merged)
    config = validate_config(merged)  # once, with the norm as rebuilt here
    weights = model_weights(ckpt, ema, str(path))
    names = stored_class_names(ckpt) or _numbered_classes(config, weights)
    if device is None:
        device = process_group.select_device(config.device)
    model = build_model(config.model, config.norm, len(names))
    load_model_weights(model, weights, stored, config_dict(config), str(path))
    model.to(device, PRECISIONS[config.trainer.dtype]).eval()
    if config.trainer.channels_last:
        model.to(memory_format=torch.channels_last)
    return TrainedRun(config=config, task=config.resolved_task, model=model, class_names=names,
                      epoch=trained_epoch(ckpt), step=trained_step(ckpt), path=path,
                      weights="ema" if ema else "model", device=device, trained_norm=trained_norm)


def overrides_of(cfg: DictConfig) -> dict[str, Any]:
    """The training-config overrides of a command's config: the non-null leaves of its sections that are
    TrainConfig's (device, data, model, norm, trainer, ...); the command's own keys (ckpt, out, ...) are not."""
    sections = {f.name for f in dataclasses.fields(TrainConfig)}

    def prune(node: Any) -> Any:
        if isinstance(node, dict):
            kept = {k: prune(v) for k, v in node.items()}
            return {k: v for k, v in kept.items() if v is not None and v != {}}
        return node

    plain = OmegaConf.to_container(cfg, resolve=True)
    return prune({k: v for k, v in plain.items() if k in sections})


def _with_overrides(stored: dict[str, Any], overrides: Mapping[str, Any]) -> DictConfig:
    """The stored training config with `overrides` merged in, ready to validate."""
    base = OmegaConf.create(stored)
    # The checkpoint already holds every weight: do not look for the (possibly absent) init files.
    base.model.weights = None
    base.model.backbone_weights = None
    base.model.pretrained = False  # nor timm's pretrained weights in the Hugging Face cache
    return OmegaConf.merge(base, dict(overrides)) if overrides else base


def _as_batchnorm(config: DictConfig) -> DictConfig:
    """`config` with its SyncBN norm replaced by nn.BatchNorm (BATCHNORM_IN_EVAL)."""
    norm = OmegaConf.to_container(config.norm, resolve=True)
    config.norm = {"name": "bn", **{k: norm[k] for k in BATCHNORM_KEYS if k in norm}}
    return config


def _numbered_classes(config: TrainConfig, weights: dict[str, torch.Tensor]) -> list[str]:
    """Class names "0".."N-1" for a checkpoint written before names were stored, N read from its weights."""
    n = _num_classes_from_weights(config, weights)
    log.warning("%s classes: the checkpoint stores no class names (written by an older version); "
                "they are named 0..%d", n, n - 1)
    return [str(i) for i in range(n)]


def _num_classes_from_weights(config: TrainConfig, weights: dict[str, torch.Tensor]) -> int:
    """The output layers are the tensors whose first dimension follows num_classes (two builds compared)."""
    shapes = [{k: v.shape for k, v in build_model(config.model, config.norm, n).state_dict().items()}
              for n in (2, 3)]
    heads = [k for k in shapes[0] if shapes[0][k][:1] == (2,) and shapes[1][k][:1] == (3,)]
    if not heads or heads[0] not in weights:
        raise ValueError("cannot tell the number of classes of this checkpoint (no class names stored, no "
                         "classifier weights found)")
    return int(weights[heads[0]].shape[0])
