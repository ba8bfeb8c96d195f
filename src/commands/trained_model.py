"""load_trained_model: a checkpoint's model ready for inference, the one checkpoint reader of predict.py and
export.py.

It reads the checkpoint through src/engine/checkpoint/state.py (the format's owner; weights_only=True), applies
the command line's overrides to the stored training config (evaluate.py's rule), validates it, and rebuilds the
model on the CPU with the trained (or EMA) weights, in eval mode. SyncBN checkpoints are rebuilt with
nn.BatchNorm2d: in eval mode both compute BatchNorm with the running statistics, the state_dict keys are the
same, and BatchNorm needs neither the compiled SyncBN kernels nor a process group (nor NCCL for torch_syncbn).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import DictConfig

log = logging.getLogger(__name__)

# Norms whose eval-mode forward is BatchNorm's with the running statistics. Only the keys BatchNorm reads are
# kept: synchronisation settings are refused for norm=bn.
BATCHNORM_IN_EVAL = ("syncbn", "torch_syncbn")
BATCHNORM_KEYS = ("eps", "momentum", "affine_trainable")


@dataclass
class TrainedModel:
    """A checkpoint's model (CPU, float32 or the run's trainer.dtype, eval mode) and what to use it with."""

    model: torch.nn.Module
    config: DictConfig  # the validated training config (norm=bn where the run used syncbn / torch_syncbn)
    task: str  # "classification" | "segmentation"
    class_names: list[str] = field(default_factory=list)
    source: str = ""


def load_trained_model(path: str | Path, overrides: Optional[DictConfig | dict[str, Any]] = None,
                       ema: bool = False) -> TrainedModel:
    """The model stored in checkpoint `path`, rebuilt from its training config with `overrides` applied
    (non-null leaves of the device/data/model/norm/trainer sections), with the trained or EMA weights."""
    from omegaconf import OmegaConf

    from src.commands.evaluate import training_config
    from src.config import task_of, validate_config
    from src.engine.amp import PRECISIONS
    from src.engine.checkpoint.state import load_model_weights, model_weights, read_checkpoint, stored_config
    from src.models import build_model

    source = str(path)
    ckpt = read_checkpoint(path)
    train_cfg = training_config(stored_config(ckpt), OmegaConf.create(overrides or {}))
    if train_cfg.norm.name in BATCHNORM_IN_EVAL:
        train_cfg.norm = {"name": "bn", **{k: train_cfg.norm[k] for k in BATCHNORM_KEYS if k in train_cfg.norm}}
    train_cfg = validate_config(train_cfg)
    weights = model_weights(ckpt, ema, source)
    names = class_names(ckpt, train_cfg, weights)
    model = build_model(train_cfg.model, train_cfg.norm, len(names))
    load_model_weights(model, weights, ckpt["config"], OmegaConf.to_container(train_cfg, resolve=True), source)
    model.to(PRECISIONS[train_cfg.trainer.dtype]).eval()
    return TrainedModel(model, train_cfg, task_of(train_cfg), names, source)


def class_names(ckpt: dict[str, Any], train_cfg: DictConfig, weights: dict[str, torch.Tensor]) -> list[str]:
    """The training data's class names, stored in the checkpoint; numbered for checkpoints without them."""
    stored = ckpt.get("class_names")
    if stored:
        return [str(n) for n in stored]
    n = _num_classes_from_weights(train_cfg, weights)
    log.warning("%s classes: the checkpoint stores no class names (written by an older version); "
                "predictions name them 0..%d", n, n - 1)
    return [str(i) for i in range(n)]


def _num_classes_from_weights(train_cfg: DictConfig, weights: dict[str, torch.Tensor]) -> int:
    """The class count of a checkpoint without names: the output layers are the tensors whose first
    dimension follows num_classes (compared between two builds of the model)."""
    from src.models import build_model

    shapes = [{k: v.shape for k, v in build_model(train_cfg.model, train_cfg.norm, n).state_dict().items()}
              for n in (2, 3)]
    heads = [k for k in shapes[0] if shapes[0][k][:1] == (2,) and shapes[1][k][:1] == (3,)]
    if not heads or heads[0] not in weights:
        raise ValueError("cannot tell the number of classes of this checkpoint (no class names stored, no "
                         "classifier weights found)")
    return int(weights[heads[0]].shape[0])
