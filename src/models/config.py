"""Model and norm config schemas (Hydra structured configs) and their validation."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional

# Model names by family. CIFAR ResNets follow He et al. 2016, section 4.2 (depth = 6n + 2).
CIFAR_RESNET_DEPTHS = {"resnet20": 20, "resnet32": 32, "resnet44": 44, "resnet56": 56, "resnet110": 110,
                       "resnet1202": 1202}
IMAGENET_RESNETS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")
DEEPLAB_BACKBONES = ("resnet18", "resnet34", "resnet50", "resnet101")
DEEPLAB_MODELS = tuple(f"deeplabv3_{b}" for b in DEEPLAB_BACKBONES) + tuple(
    f"deeplabv3plus_{b}" for b in DEEPLAB_BACKBONES)
CLASSIFICATION_MODELS = tuple(CIFAR_RESNET_DEPTHS) + IMAGENET_RESNETS
SEGMENTATION_MODELS = DEEPLAB_MODELS
MODEL_NAMES = CLASSIFICATION_MODELS + SEGMENTATION_MODELS

NORM_NAMES = ("bn", "syncbn", "torch_syncbn", "gn", "frozen_bn")


@dataclass
class ModelConfig:
    """`model` config group: which network to build and how (conf/model/*.yaml)."""

    name: str = "resnet20"
    # Segmentation only: backbone output stride (8 -> dilation in layer3+layer4, ASPP rates 12/24/36;
    # 16 -> dilation in layer4, ASPP rates 6/12/18). Checked for every model so a typo never hides.
    output_stride: int = 16
    # Segmentation only: weight of the auxiliary FCN head's loss (on layer3); 0 builds no aux head.
    aux_loss_weight: float = 0.0
    # Segmentation only: width of the ASPP / decoder convolutions (256 in the papers and in torchvision).
    head_channels: int = 256
    # DeepLabV3+ only: output stride of the decoder's logits. 4 = the paper's decoder on layer1 features;
    # 2 = a further stage on the stem's features, for small images (64 px: 32x32 logits instead of 16x16).
    decoder_stride: int = 4
    # CIFAR ResNets only: "A" = parameter-free identity shortcut with zero-padded channels (the paper's
    # CIFAR choice, 0.27M params for ResNet-20), "B" = 1x1 conv + norm projection when the shape changes.
    cifar_shortcut: str = "A"
    # Zero-init the last norm layer's weight in every residual block (Goyal et al. 2017).
    zero_init_residual: bool = False
    # Local file with ResNet weights for the backbone (torchvision layout; `fc.*` is ignored).
    backbone_weights: Optional[str] = None
    # Local file with weights for the whole model (a state_dict, or a checkpoint with a "model" key).
    weights: Optional[str] = None
    # strict=true: every key and shape must match; false: load what matches and log what was skipped.
    weights_strict: bool = True

    def validate(self, check_files: bool = True) -> None:
        """Raise ValueError naming the bad key and how to fix it; check_files: the weights files must exist."""
        if self.name not in MODEL_NAMES:
            raise ValueError(f"model.name must be one of {', '.join(MODEL_NAMES)}; got {self.name!r} "
                             "(pick a file from conf/model/, e.g. model=resnet20)")
        if self.output_stride not in (8, 16):
            raise ValueError(f"model.output_stride must be 8 or 16, got {self.output_stride}")
        if not (isinstance(self.aux_loss_weight, (int, float)) and math.isfinite(self.aux_loss_weight)
                and self.aux_loss_weight >= 0):
            raise ValueError(f"model.aux_loss_weight must be a finite number >= 0 (0 = no aux head), "
                             f"got {self.aux_loss_weight}")
        if self.aux_loss_weight > 0 and self.name not in SEGMENTATION_MODELS:
            raise ValueError(f"model.aux_loss_weight applies only to segmentation models; set "
                             f"model.aux_loss_weight=0 for {self.name}")
        if self.head_channels < 1:
            raise ValueError(f"model.head_channels must be >= 1, got {self.head_channels}")
        if self.decoder_stride not in (2, 4):
            raise ValueError(f"model.decoder_stride must be 4 or 2, got {self.decoder_stride}")
        if self.decoder_stride != 4 and not self.name.startswith("deeplabv3plus_"):
            raise ValueError(f"model.decoder_stride={self.decoder_stride} applies only to DeepLabV3+ "
                             f"(deeplabv3plus_*); set model.decoder_stride=4 for {self.name}")
        if self.cifar_shortcut not in ("A", "B"):
            raise ValueError(f"model.cifar_shortcut must be A or B, got {self.cifar_shortcut!r}")
        if self.weights and self.backbone_weights:
            raise ValueError("model.weights (whole model) and model.backbone_weights are both set; "
                             "keep one: model.backbone_weights=null when model.weights is given")
        for key in ("weights", "backbone_weights") if check_files else ():
            path = getattr(self, key)
            if path and not os.path.isfile(os.path.expanduser(path)):
                raise ValueError(f"model.{key}: no file at {path!r}. Nothing is downloaded (offline); copy the "
                                 f"weights file there or set model.{key}=null")


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

    def validate(self, device: Optional[str] = "auto") -> None:
        """Raise ValueError naming the bad key; device (auto|cpu|cuda, None = skip): GPU needs of (torch_)syncbn."""
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
