"""build_model / model_task: config -> nn.Module with the chosen norm everywhere and optional weights."""

from __future__ import annotations

from typing import Any, Mapping, TypeVar, Union

from torch import nn

from src.dataclass_config import to_dataclass
from src.models.cifar_resnet import CifarResNet
from src.models.config import (CIFAR_RESNET_DEPTHS, IMAGENET_RESNETS, SEGMENTATION_MODELS, ModelConfig,
                               NormConfig)
from src.models.deeplab import build_deeplab
from src.models.norms import finalize_norms, norm_layer_factory
from src.models.resnet import build_resnet_classifier
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
    return "segmentation" if cfg.name in SEGMENTATION_MODELS else "classification"


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
    if not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be an int >= 1, got {num_classes!r}")
    norm_layer = norm_layer_factory(ncfg)
    name = mcfg.name
    if name in CIFAR_RESNET_DEPTHS:
        model: nn.Module = CifarResNet(CIFAR_RESNET_DEPTHS[name], num_classes, norm_layer, mcfg.cifar_shortcut,
                                       mcfg.zero_init_residual)
    elif name in IMAGENET_RESNETS:
        model = build_resnet_classifier(name, num_classes, norm_layer, mcfg.zero_init_residual)
    else:
        model = build_deeplab(name, num_classes, norm_layer, mcfg.output_stride, aux=mcfg.aux_loss_weight > 0,
                              head_channels=mcfg.head_channels, zero_init_residual=mcfg.zero_init_residual,
                              decoder_stride=mcfg.decoder_stride)
    model = finalize_norms(model, ncfg)
    # Weights are loaded after the norm conversion: bn / syncbn / frozen_bn share state_dict keys.
    if weights_files and mcfg.backbone_weights:
        target = model.backbone if name in SEGMENTATION_MODELS else model
        load_weights(target, mcfg.backbone_weights, strict=mcfg.weights_strict, ignore_prefixes=("fc.",),
                     what="model.backbone_weights")
    if weights_files and mcfg.weights:
        load_weights(model, mcfg.weights, strict=mcfg.weights_strict, what="model.weights")
    return model
