"""Any timm or torchvision classifier by name: `model=timm model.arch=NAME`, `model=torchvision model.arch=NAME`.

Both are built with the architecture's own BatchNorm layers and then given the configured norm
(`adopt_norm`, then build_model's `finalize_norms`), rather than by passing a `norm_layer`: many
architectures take none (densenet, timm's EfficientNets build BatchNormAct2d), and those that do set
their own eps and momentum (torchvision's MobileNetV3: 1e-3 / 0.01), which their weights files assume.
Pretrained weights by name come through each library's cache (src/models/pretrained.py): timm's with
model.pretrained=true (the Hugging Face hub cache, handed to timm as a local file so that timm adapts them
as it always does: another num_classes re-initialises the head), torchvision's with model.weights=<name>
(loaded by build_model like a weights file).
"""
from __future__ import annotations

import difflib
from typing import Any

from torch import nn

from src.models.activation_checkpointing import resnet_stages
from src.models.config import ModelConfig, NormConfig
from src.models.norms import adopt_norm
from src.models.registry import IMAGE_LOGITS, MODELS, ModelFamily

# Options the config owns: num_classes comes from the data, weights from local files.
_RESERVED_KWARGS = ("num_classes", "pretrained", "weights", "pretrained_cfg_overlay")
# torchvision builders whose defaults do not fit a trainer: GoogLeNet / Inception-v3 return (logits, aux)
# tuples in training with aux_logits=True, and warn unless init_weights is given when weights=None.
_TORCHVISION_DEFAULTS: dict[str, dict[str, Any]] = {
    "googlenet": {"aux_logits": False, "init_weights": True},
    "inception_v3": {"aux_logits": False, "init_weights": True},
}


def _import_timm() -> Any:
    try:
        import timm
    except ImportError as err:
        raise ImportError(f"model=timm needs the timm package, which cannot be imported ({err}); install it: "
                          "pip install 'timm>=1.0,<2' (it is in requirements.txt)") from err
    return timm


def _check_kwargs(cfg: ModelConfig) -> None:
    reserved = sorted(set(cfg.kwargs) & set(_RESERVED_KWARGS))
    if reserved:
        raise ValueError(f"model.kwargs may not set {reserved}: the number of classes comes from the data and "
                         "weights from model.weights / model.backbone_weights (a local file or a torchvision "
                         "weights name) or, for timm, model.pretrained=true")


def _unknown_arch(cfg: ModelConfig, known: list[str], how: str) -> ValueError:
    close = difflib.get_close_matches(cfg.arch or "", known, n=5, cutoff=0.6)
    hint = f"; close names: {', '.join(close)}" if close else ""
    return ValueError(f"model.arch={cfg.arch!r} is not a {cfg.name} classification model{hint} ({how} lists them)")


def check_timm(cfg: ModelConfig) -> None:
    """model.arch is a timm model and model.kwargs leaves num_classes and weights alone."""
    timm = _import_timm()
    _check_kwargs(cfg)
    if not timm.is_model(cfg.arch):
        raise _unknown_arch(cfg, timm.list_models(), "timm.list_models()")


def check_torchvision(cfg: ModelConfig) -> None:
    """model.arch is a torchvision classification model and model.kwargs leaves num_classes and weights alone."""
    from torchvision import models

    _check_kwargs(cfg)
    known = models.list_models(module=models)  # classification models only
    if cfg.arch not in known:
        raise _unknown_arch(cfg, known, "torchvision.models.list_models(module=torchvision.models)")


def classifier_module_names(model: nn.Module, num_classes: int) -> tuple[str, ...]:
    """The module that produces the logits: the last nn.Linear with num_classes outputs (else the last such
    1x1-style nn.Conv2d, as in SqueezeNet)."""
    for kind, width in ((nn.Linear, "out_features"), (nn.Conv2d, "out_channels")):
        names = [name for name, m in model.named_modules() if isinstance(m, kind) and getattr(m, width) == num_classes]
        if names:
            return (names[-1],)
    raise ValueError(f"cannot find the classifier of {type(model).__name__}: no nn.Linear or nn.Conv2d with "
                     f"{num_classes} outputs")


def timm_pretrained(cfg: ModelConfig) -> str:
    """model.pretrained=true: the local file of timm's pretrained weights of model.arch (its Hugging Face hub cache;
    downloaded when missing unless offline, src/models/pretrained.py)."""
    from timm.models import get_pretrained_cfg

    from src.models.pretrained import timm_pretrained_file

    pretrained_cfg = get_pretrained_cfg(cfg.arch)
    if pretrained_cfg is None:
        raise ValueError(f"model=timm model.arch={cfg.arch} model.pretrained=true: timm has no pretrained "
                         "weights for it (timm.list_pretrained() lists the names that have); set "
                         "model.pretrained=false")
    return timm_pretrained_file(pretrained_cfg.to_dict())


def _timm_weights_builder(cfg: ModelConfig, key: str) -> str:
    raise ValueError(f"model.{key}={getattr(cfg, key)}: timm's weights are chosen by model.arch (with its tag, e.g. "
                     f"resnet18.a1_in1k) and loaded with model.pretrained=true; model.{key} takes a local file only")


def _timm_checkpointing(model: nn.Module) -> list[str]:
    """timm's own set_grad_checkpointing (non-reentrant, so BatchNorm sees its recomputation)."""
    from timm.layers import use_reentrant_ckpt

    if use_reentrant_ckpt():
        raise ValueError("trainer.activation_checkpointing=true needs timm's non-reentrant checkpoints, but timm is "
                         "set to reentrant ones (TIMM_REENTRANT_CKPT or timm.layers.set_reentrant_ckpt); unset it")
    try:
        model.set_grad_checkpointing(True)
    except (AssertionError, NotImplementedError) as err:
        raise ValueError(f"trainer.activation_checkpointing=true: timm's {type(model).__name__} does not support "
                         f"gradient checkpointing ({err or 'set_grad_checkpointing refused'}); "
                         "set trainer.activation_checkpointing=false") from err
    return ["(timm set_grad_checkpointing)"]


def _torchvision_resnets_only(cfg: ModelConfig) -> None:
    """trainer.activation_checkpointing: only torchvision's ResNet family has the stages (layer1..layer4)."""
    from torchvision import models

    builder = models.get_model_builder(cfg.arch) if cfg.arch else None
    if builder is None or builder.__module__ != models.resnet.__name__:
        raise ValueError(
            f"trainer.activation_checkpointing=true: model=torchvision model.arch={cfg.arch}: only torchvision's "
            "ResNet family (resnet*, resnext*, wide_resnet*) has stages known to the trainer; use model=timm "
            "(timm's own checkpointing) or set trainer.activation_checkpointing=false"
        )


# Classifiers chosen by model.arch: every task that reads per-image logits.
TIMM = ModelFamily("timm", output=IMAGE_LOGITS, arch=True, check=check_timm, weights_builder=_timm_weights_builder,
                   pretrained_file=timm_pretrained, checkpoint_stages=_timm_checkpointing)
TORCHVISION = ModelFamily("torchvision", output=IMAGE_LOGITS, arch=True, check=check_torchvision,
                          weights_builder=lambda cfg, key: cfg.arch, checkpoint_stages=resnet_stages,
                          checkpoint_check=_torchvision_resnets_only)


@MODELS.register("timm", family=TIMM)
def build_timm(cfg: ModelConfig, norm_cfg: NormConfig, num_classes: int) -> nn.Module:
    """timm.create_model(model.arch, pretrained=model.pretrained, num_classes=..., **model.kwargs), configured norm."""
    timm = _import_timm()
    kwargs = dict(cfg.kwargs)
    if cfg.zero_init_residual:
        kwargs.setdefault("zero_init_last", True)  # timm's name for it (ResNets, RegNets, ...)
    if cfg.pretrained:
        # A local file: timm reads it as it would its own download, with no Hugging Face hub call.
        kwargs["pretrained_cfg_overlay"] = {"file": timm_pretrained(cfg)}
    try:
        model = timm.create_model(cfg.arch, pretrained=cfg.pretrained, num_classes=num_classes, **kwargs)
    except TypeError as err:
        extra = " (model.zero_init_residual=true becomes zero_init_last=True)" if cfg.zero_init_residual else ""
        raise ValueError(f"model=timm model.arch={cfg.arch}: timm.create_model rejected the options "
                         f"{sorted(kwargs)}{extra}: {err}") from err
    heads = model.pretrained_cfg.get("classifier") if hasattr(model, "pretrained_cfg") else None
    names = (heads,) if isinstance(heads, str) else tuple(heads or ())
    model.head_module_names = (names if names and all(n in dict(model.named_modules()) for n in names)
                               else classifier_module_names(model, num_classes))
    return adopt_norm(model, norm_cfg)


@MODELS.register("torchvision", family=TORCHVISION)
def build_torchvision(cfg: ModelConfig, norm_cfg: NormConfig, num_classes: int) -> nn.Module:
    """torchvision.models.get_model(model.arch, weights=None, num_classes=..., **model.kwargs), configured norm."""
    from torchvision import models

    kwargs = {**_TORCHVISION_DEFAULTS.get(cfg.arch, {}), **cfg.kwargs}
    if cfg.zero_init_residual:
        kwargs["zero_init_residual"] = True
    model = models.get_model(cfg.arch, weights=None, num_classes=num_classes, **kwargs)
    # Some builders swallow unknown keyword arguments: only the ResNet family has this option.
    if cfg.zero_init_residual and not isinstance(model, models.ResNet):
        raise ValueError(f"model.zero_init_residual=true: torchvision's {cfg.arch} has no such option (only its "
                         "ResNet / ResNeXt / Wide ResNet models); set model.zero_init_residual=false")
    model.head_module_names = classifier_module_names(model, num_classes)
    return adopt_norm(model, norm_cfg)
