"""build_model: config -> nn.Module with the chosen norm everywhere and optional weights."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, TypeVar, Union

from torch import nn

from src.dataclass_config import to_dataclass
from src.models.config import ModelConfig, NormConfig, check_model_norm, model_schema
from src.models.norms import finalize_norms
from src.models.param_groups import head_module_names
from src.models.pretrained import (is_weights_name, torchvision_state_dict, torchvision_weights,
                                   weights_num_classes, weights_source)
from src.models.registry import MODELS
from src.models.weights import apply_state_dict, read_state_dict

T = TypeVar("T", ModelConfig, NormConfig)
ConfigLike = Union[ModelConfig, NormConfig, Mapping[str, Any], Any]  # dataclass, dict or OmegaConf DictConfig


def as_config(cfg: ConfigLike, schema: type[T]) -> T:
    """The dataclass instance for a dataclass, a dict or a (structured or plain) OmegaConf DictConfig; a model
    config as model_schema()'s, with its families' options (at their defaults when `cfg` has none)."""
    if schema is not ModelConfig:
        return to_dataclass(cfg, schema, "norm")
    full = model_schema()
    if isinstance(cfg, ModelConfig) and not isinstance(cfg, full):  # the core keys alone: the options' defaults
        return full(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(ModelConfig)})
    return to_dataclass(cfg, full, "model")


def build_model(model_cfg: ConfigLike, norm_cfg: ConfigLike, num_classes: int, *,
                weights_files: bool = True) -> nn.Module:
    """The configured network, on CPU, initialised only from torch's global RNG (same seed -> same weights on
    every rank), with norm_cfg's layer in every norm position and the configured weights files loaded.

    Weights (model.weights / model.backbone_weights: local files or torchvision names; model.pretrained: timm)
    are read from local files or the libraries' caches (src/models/pretrained.py).
    weights_files=False skips all of them (and the files' existence check): for
    callers that load a checkpoint right after (evaluation, resume), where those files may be long gone.
    """
    # Dataclass instances come validated (config validation checks each group once); dicts and OmegaConf nodes
    # are checked here. Hardware needs of torch_syncbn are the app's config validation's (NormConfig.validate
    # with the run's device): building one on a CPU-only machine stays possible (inspection, conversion).
    mcfg, ncfg = as_config(model_cfg, ModelConfig), as_config(norm_cfg, NormConfig)
    if not isinstance(model_cfg, ModelConfig):
        mcfg.validate(check_files=weights_files)
    if not isinstance(norm_cfg, NormConfig):
        ncfg.validate(device=None)
    if not (isinstance(model_cfg, ModelConfig) and isinstance(norm_cfg, NormConfig)):
        check_model_norm(mcfg, ncfg)
    if not weights_files:  # timm's pretrained weights are loaded by its builder: off here too
        mcfg = dataclasses.replace(mcfg, pretrained=False)
    if not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be an int >= 1, got {num_classes!r}")
    entry = MODELS.get(mcfg.name)
    model = entry.builder(mcfg, ncfg, num_classes)
    model = finalize_norms(model, ncfg)
    # Weights are loaded after the norm conversion: bn / syncbn / frozen_bn share state_dict keys.
    if weights_files and mcfg.backbone_weights:
        backbone_attr = entry.info.get("backbone_attr")
        if backbone_attr:  # a ResNet trunk inside a model with its own heads (DeepLab, detection): no `fc`
            target, ignore = model.get_submodule(backbone_attr), ("fc.",)
        else:  # a classifier's own head (fc, classifier, head.fc, ...) is left to train from scratch
            target, ignore = model, tuple(f"{name}." for name in head_module_names(model))
        state, source = _weights(mcfg, entry, "backbone_weights")
        apply_state_dict(target, state, source, strict=mcfg.weights_strict, ignore_prefixes=ignore,
                         what="model.backbone_weights")
    if weights_files and mcfg.weights:
        state, source = _weights(mcfg, entry, "weights")
        ignore = ()
        if is_weights_name(mcfg.weights) and num_classes != weights_num_classes(
                torchvision_weights(weights_source(mcfg, "weights"), mcfg.weights, "model.weights")):
            # Weights for other classes: everything but the head, which keeps its initialisation.
            ignore = tuple(f"{name}." for name in head_module_names(model))
        apply_state_dict(model, state, source, strict=mcfg.weights_strict, ignore_prefixes=ignore,
                         what="model.weights")
    return model


def _weights(mcfg: ModelConfig, entry: Any, key: str) -> tuple[dict[str, Any], str]:
    """(state_dict, where it came from) of model.<key>: a torchvision weights name, or a local file."""
    value = getattr(mcfg, key)
    if not is_weights_name(value):
        return read_state_dict(value), value
    weights = torchvision_weights(weights_source(mcfg, key), value, f"model.{key}")
    return torchvision_state_dict(weights, f"model.{key}"), f"{type(weights).__name__}.{weights.name}"
