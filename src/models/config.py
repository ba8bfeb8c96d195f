"""Model and norm config schemas (Hydra structured configs) and their validation.

Which names `model.name` may take and each one's family are the registry's (src/models/registry.py): every model
family registers its builders there with a ModelFamily (its outputs, its `options`, the dataclass of the keys it
adds to the `model` group, and its answers about weights and checks), and the checks here read it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from src.dataclass_config import Owned, extend, foreign_settings, section
from src.models.pretrained import check_cached_when_offline, is_weights_name, torchvision_weights, weights_source
from src.models.registry import MODELS, model_family

NORM_NAMES = ("bn", "syncbn", "torch_syncbn", "gn", "frozen_bn")
# Norms that keep BatchNorm layers (with their eps and momentum) in the network.
BATCHNORM_KINDS = ("bn", "syncbn", "torch_syncbn", "frozen_bn")


@dataclass
class ModelConfig:
    """`model` config group: which network to build and how (conf/model/*.yaml). These are the keys every model
    family reads; a family's own keys (model.output_stride, model.head_channels, ...) are declared next to its
    builder (its ModelFamily's `options`) and added to this schema by model_schema()."""

    name: str = "resnet20"
    # Zero-init the last norm layer's weight in every residual block (Goyal et al. 2017).
    zero_init_residual: bool = False
    # ResNet weights for the backbone (`fc.*` and a classifier's head are ignored): a local file (torchvision
    # layout), or a torchvision weights name (DEFAULT, IMAGENET1K_V1) of the backbone's ResNet.
    backbone_weights: Optional[str] = None
    # Weights for the whole model: a local file (a state_dict, or a checkpoint with a "model" key), or for
    # torchvision models and our ImageNet ResNets a torchvision weights name (DEFAULT, IMAGENET1K_V2, ...)
    # from TORCH_HOME's cache; with another num_classes than the weights' head, the head is left to train.
    weights: Optional[str] = None
    # model=timm only: timm's pretrained weights of model.arch (from the Hugging Face hub cache).
    pretrained: bool = False
    # strict=true: every key and shape must match; false: load what matches and log what was skipped.
    weights_strict: bool = True
    # model=timm / model=torchvision only: the architecture, e.g. efficientnet_b0 (timm.list_models(),
    # torchvision.models.list_models(module=torchvision.models) list them).
    arch: Optional[str] = None
    # model=timm / model=torchvision only: extra keyword arguments for timm.create_model /
    # torchvision.models.get_model, e.g. {drop_path_rate: 0.1}.
    kwargs: Dict[str, Any] = field(default_factory=dict)

    def validate(self, check_files: bool = True) -> None:
        """Raise ValueError naming the bad key and how to fix it; check_files: the weights files must exist."""
        if self.name not in MODELS:
            raise ValueError(f"model.name must be one of {', '.join(MODELS.names())}; got {self.name!r} "
                             "(pick a file from conf/model/, e.g. model=resnet20)")
        entry = MODELS.get(self.name)
        family = entry.info["family"]
        if family.arch:
            if not self.arch:
                raise ValueError(f"model={self.name} needs model.arch=<architecture name>, e.g. "
                                 f"model={self.name} model.arch=resnet18")
        elif self.arch is not None or self.kwargs:
            raise ValueError(f"model.arch and model.kwargs apply only to model=timm / model=torchvision; "
                             f"remove them for model={self.name}")
        _check_family_options(self, entry)
        if self.weights and self.backbone_weights:
            raise ValueError("model.weights (whole model) and model.backbone_weights are both set; "
                             "keep one: model.backbone_weights=null when model.weights is given")
        self._validate_pretrained(entry)
        if check_files:
            check_cached_when_offline(self)
        for key in ("weights", "backbone_weights") if check_files else ():
            path = getattr(self, key)
            if path and not is_weights_name(path) and not os.path.isfile(os.path.expanduser(path)):
                raise ValueError(f"model.{key}: no file at {path!r}. Nothing is downloaded (offline); copy the "
                                 f"weights file there or set model.{key}=null")
        if family.check is not None:  # the family's own rules across its options (e.g. model.arch exists in timm)
            family.check(self)

    def _validate_pretrained(self, entry: Any) -> None:
        """Weights by name: a name the model family's torchvision enum has; model.pretrained where the family has
        a library's pretrained weights (timm)."""
        family = entry.info["family"]
        for key in ("weights", "backbone_weights"):
            name = getattr(self, key)
            if is_weights_name(name):
                torchvision_weights(weights_source(self, key), name, f"model.{key}")
        if self.pretrained and family.pretrained_file is None:
            hint = "model.weights=<local file>"
            if entry.info.get("backbone"):  # a ResNet trunk with heads: DeepLab, detection
                hint = "model.backbone_weights=DEFAULT"
            elif family.weights_builder is not None:
                hint = "model.weights=DEFAULT"
            having = [e.name for e in MODELS if e.info["family"].pretrained_file is not None]
            raise ValueError(f"model.pretrained=true applies to model={' / model='.join(having)} only; for "
                             f"model={self.name} use {hint}")
        if self.pretrained and (self.weights or self.backbone_weights):
            raise ValueError("model.pretrained=true and a weights file are both set; keep one: "
                             "model.weights=null model.backbone_weights=null, or model.pretrained=false")


def family_options() -> list[Owned]:
    """(family name, its option dataclass) of every registered family that declares options, once per family."""
    return list(dict.fromkeys((e.info["family"].name, e.info["family"].options) for e in MODELS
                              if e.info["family"].options is not None))


def model_schema() -> type[ModelConfig]:
    """The `model` group's schema: ModelConfig with every registered family's options."""
    return _schema(tuple(family_options()))


@functools.lru_cache(maxsize=None)
def _schema(parts: tuple[Owned, ...]) -> type[ModelConfig]:
    return extend(ModelConfig, parts)


def model_config(**values: Any) -> ModelConfig:
    """A `model` group config (model_schema()) from keyword values, the others at their defaults."""
    return model_schema()(**values)


def _check_family_options(cfg: ModelConfig, entry: Any) -> None:
    """The model's family checks its own options; an option of another family set away from its default is
    refused (nothing would read it)."""
    full = model_schema()
    if not isinstance(cfg, full):  # the core keys alone: the families' options at their defaults
        cfg = full(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(ModelConfig)})
    family = entry.info["family"]
    if family.options is not None:
        options = section(cfg, family.options)
        if hasattr(options, "validate"):
            options.validate()
    active = {family.name} if family.options is not None else set()
    for key, value, owners in foreign_settings(cfg, family_options(), active):
        raise ValueError(f"model.{key}={value!r} is not read by model={cfg.name}: it is an option of "
                         f"{', '.join(owners)} models; remove it")


@dataclass
class NormConfig:
    """`norm` config group: the normalisation layer used everywhere in the model (conf/norm/*.yaml)."""

    # bn | syncbn (ours, src.syncbn) | torch_syncbn (nn.SyncBatchNorm, CUDA+NCCL) | gn | frozen_bn
    name: str = "bn"
    eps: float = 1e-5
    # Running-statistics momentum; null = cumulative moving average (PyTorch's momentum=None).
    momentum: Optional[float] = 0.1
    # gn only: groups per GroupNorm layer; must divide every norm layer's channel count (16 divides all of
    # ours: CIFAR ResNets start at 16 channels, DeepLabV3+ projects low-level features to 48).
    num_groups: int = 16
    # false: the norm layers' weight and bias get no gradient (with frozen_bn: detectron2's FrozenBatchNorm).
    affine_trainable: bool = True
    # syncbn only, trading exactness for communication (docs/syncbn.md). group_size: statistics shared within
    # groups of this many consecutive ranks (must divide the world size); null = all ranks.
    group_size: Optional[int] = None
    # syncbn only: statistics synchronised on every N-th training forward, this rank's batch otherwise.
    sync_every: int = 1
    # syncbn only: synchronised for the first S optimizer steps, per-rank statistics after; null = always.
    sync_until_step: Optional[int] = None
    # syncbn on a GPU only: before training, check our CUDA kernels against PyTorch's on this GPU (once per
    # GPU, driver and build; docs/gpu.md). error: stop on a disagreement | fallback: use torch's
    # nn.SyncBatchNorm instead, with a warning | off: skip the check.
    cuda_selfcheck: str = "error"

    def validate(self, device: Optional[str] = "auto", world_size: Optional[int] = None) -> None:
        """Raise ValueError naming the bad key; device (auto|cpu|cuda, None = skip) checks the GPU needs of (torch_)syncbn,
        world_size (None = skip) that norm.group_size divides it."""
        if self.name not in NORM_NAMES:
            raise ValueError(f"norm.name must be one of {', '.join(NORM_NAMES)}; got {self.name!r} "
                             "(e.g. norm=syncbn)")
        if not (self.eps > 0 and math.isfinite(self.eps)):
            raise ValueError(f"norm.eps must be a positive number, got {self.eps}")
        if self.momentum is not None and not 0.0 <= self.momentum <= 1.0:
            raise ValueError(f"norm.momentum must be in [0, 1] or null (cumulative average), got {self.momentum}")
        if self.num_groups < 1:
            raise ValueError(f"norm.num_groups must be >= 1, got {self.num_groups}")
        if self.name == "torch_syncbn" and device is not None:
            _check_torch_syncbn_device(device)
        if self.name == "syncbn" and device is not None and device != "cpu":
            _check_syncbn_cuda_kernels(device)
        self._validate_sync_modes(world_size)
        self._validate_cuda_selfcheck()

    def _validate_cuda_selfcheck(self) -> None:
        from src.syncbn.selfcheck import check_mode

        check_mode(self.cuda_selfcheck)
        modes = {"group_size": (self.group_size, None), "sync_every": (self.sync_every, 1),
                 "sync_until_step": (self.sync_until_step, None)}
        changed = [key for key, (value, default) in modes.items() if value != default]
        if self.cuda_selfcheck == "fallback" and changed:
            raise ValueError(f"norm.cuda_selfcheck=fallback cannot keep norm.{changed[0]} (torch's nn.SyncBatchNorm "
                             f"has no such mode): use norm.cuda_selfcheck=error, or drop norm.{changed[0]}")

    def _validate_sync_modes(self, world_size: Optional[int]) -> None:
        modes = {"group_size": (self.group_size, None), "sync_every": (self.sync_every, 1),
                 "sync_until_step": (self.sync_until_step, None)}
        changed = [key for key, (value, default) in modes.items() if value != default]
        if changed and self.name != "syncbn":
            raise ValueError(f"norm.{changed[0]} applies only to norm=syncbn (ours); got norm={self.name}")
        from src.syncbn.groups import check_group_size  # the one rule, also applied by the library itself

        check_group_size(self.group_size, world_size, key="norm.group_size")
        if self.sync_every < 1:
            raise ValueError(f"norm.sync_every must be >= 1 (1 = every training forward), got {self.sync_every}")
        if self.sync_until_step is not None and self.sync_until_step < 0:
            raise ValueError(f"norm.sync_until_step must be >= 0 or null (synchronise throughout), "
                             f"got {self.sync_until_step}")


def check_model_norm(model_cfg: ModelConfig, norm_cfg: NormConfig) -> None:
    """Checks that need both groups: zoo models keep their own BatchNorm eps and momentum."""
    if not model_family(model_cfg.name).arch or norm_cfg.name not in BATCHNORM_KINDS:
        return
    defaults = {f.name: f.default for f in dataclasses.fields(NormConfig)}
    for key in ("eps", "momentum"):
        if getattr(norm_cfg, key) != defaults[key]:
            raise ValueError(
                f"norm.{key}={getattr(norm_cfg, key)} does not apply to model={model_cfg.name}: its BatchNorm layers "
                f"keep the eps and momentum their architecture defines (and its weights files assume); leave "
                f"norm.{key} at its default ({defaults[key]})")


def _check_syncbn_cuda_kernels(device: str) -> None:
    """Our SyncBN on GPUs needs its CUDA kernels built (or nvcc to build them): refuse before training."""
    from src.syncbn.extension import cuda_kernels_problem

    problem = cuda_kernels_problem()
    if problem:
        raise ValueError(f"norm=syncbn on CUDA (device={device}): {problem}")


def _check_torch_syncbn_device(device: str) -> None:
    """nn.SyncBatchNorm only synchronises CUDA tensors over NCCL: refuse before any process group starts."""
    import torch
    import torch.distributed as dist

    usable = (device != "cpu" and torch.cuda.is_available() and dist.is_available() and dist.is_nccl_available())
    if not usable:
        raise ValueError("norm=torch_syncbn needs CUDA GPUs and the NCCL backend; on CPU use norm=syncbn "
                         f"(device={device}, cuda available={torch.cuda.is_available()})")
