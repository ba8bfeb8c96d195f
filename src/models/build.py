"""build_model / model_task: config -> nn.Module with the chosen norm everywhere and optional weights."""

from __future__ import annotations

from typing import Any, Mapping, TypeVar, Union

from torch import nn

from src.dataclass_config import to_dataclass
from src.models.config import ModelConfig, NormConfig, check_model_norm
from src.models.norms import finalize_norms
from src.models.param_groups import head_module_names
from src.models.registry import MODELS
from src.models.weights import load_weights

T = TypeVar("T", ModelConfig, NormConfig)
ConfigLike = Union[ModelConfig, NormConfig, Mapping[str, Any], Any]  # dataclass, dict or OmegaConf DictConfig


def as_config(cfg: ConfigLike, schema: type[T]) -> T:
    """The dataclass instance for a dataclass, a dict or a (structured or plain) OmegaConf DictConfig."""
    return to_dataclass(cfg, schema, "model" if schema is ModelConfig else "norm")


def model_task(model_cfg: ConfigLike) -> str:
    """"classification" or "segmentation" for a model config."""
    cfg = as_config(model_cfg, ModelConfig)
    cfg.validate(check_files=False)
    return MODELS.get(cfg.name).task


def build_model(model_cfg: ConfigLike, norm_cfg: ConfigLike, num_classes: int, *,
                weights_files: bool = True) -> nn.Module:
    """The configured network, on CPU, initialised only from torch's global RNG (same seed -> same weights on
    every rank), with norm_cfg's layer in every norm position and the configured weights files loaded.

    weights_files=False skips model.weights / model.backbone_weights (and their existence check): for
    callers that load a checkpoint right after (evaluation, resume), where those files may be long gone.
    """
    mcfg, ncfg = as_config(model_cfg, ModelConfig), as_config(norm_cfg, NormConfig)
    mcfg.validate(check_files=weights_files)
    # Hardware needs of torch_syncbn are checked by the app's config validation (NormConfig.validate with
    # the run's device); building one on a CPU-only machine stays possible (inspection, conversion).
    ncfg.validate(device=None)
    check_model_norm(mcfg, ncfg)
    if not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be an int >= 1, got {num_classes!r}")
    entry = MODELS.get(mcfg.name)
    model = entry.builder(mcfg, ncfg, num_classes)
    model = finalize_norms(model, ncfg)
    # Weights are loaded after the norm conversion: bn / syncbn / frozen_bn share state_dict keys.
    if weights_files and mcfg.backbone_weights:
        if entry.task == "segmentation":
            target, ignore = model.backbone, ("fc.",)
        else:  # a classifier's own head (fc, classifier, head.fc, ...) is left to train from scratch
            target, ignore = model, tuple(f"{name}." for name in head_module_names(model))
        load_weights(target, mcfg.backbone_weights, strict=mcfg.weights_strict, ignore_prefixes=ignore,
                     what="model.backbone_weights")
    if weights_files and mcfg.weights:
        load_weights(model, mcfg.weights, strict=mcfg.weights_strict, what="model.weights")
    return model
