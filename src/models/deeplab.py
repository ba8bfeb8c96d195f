"""DeepLabV3 and DeepLabV3+ on ResNet-18/34/50/101, from torchvision's segmentation building blocks."""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models._utils import IntermediateLayerGetter
from torchvision.models.segmentation.deeplabv3 import ASPP, DeepLabV3
from torchvision.models.segmentation.fcn import FCNHead

from src.models.activation_checkpointing import resnet_stages
from src.models.config import ModelConfig, NormConfig
from src.models.norms import NormLayer, norm_layer_factory, replace_batchnorm2d
from src.models.pretrained import backbone_weights_builder
from src.models.registry import MODELS, PIXEL_LOGITS, ModelFamily
from src.models.resnet import build_dilated_resnet, feature_channels

BACKBONES = ("resnet18", "resnet34", "resnet50", "resnet101")

# Output stride -> (replace_stride_with_dilation for layer2..4, ASPP atrous rates), as in the DeepLabV3 paper.
OUTPUT_STRIDES: dict[int, tuple[tuple[bool, bool, bool], tuple[int, int, int]]] = {
    8: ((False, True, True), (12, 24, 36)),
    16: ((False, False, True), (6, 12, 18)),
}
LOW_LEVEL_CHANNELS = 48  # DeepLabV3+ paper: project layer1 features to 48 channels
FINE_CHANNELS = 16  # decoder_stride=2: the stem's features, projected like the low-level ones but narrower


@dataclass
class DeepLabOptions:
    """The `model` keys the DeepLab models read (conf/model/deeplabv3*.yaml)."""

    # Backbone output stride: 8 -> dilation in layer3+layer4, ASPP rates 12/24/36; 16 -> dilation in layer4,
    # ASPP rates 6/12/18.
    output_stride: int = 16
    # Weight of the auxiliary FCN head's loss (on layer3); 0 builds no aux head.
    aux_loss_weight: float = 0.0
    # Width of the ASPP / decoder convolutions (256 in the papers and in torchvision).
    head_channels: int = 256

    def validate(self) -> None:
        """Raise ValueError naming the bad key."""
        if self.output_stride not in OUTPUT_STRIDES:
            raise ValueError(f"model.output_stride must be 8 or 16, got {self.output_stride}")
        if not (isinstance(self.aux_loss_weight, (int, float)) and math.isfinite(self.aux_loss_weight)
                and self.aux_loss_weight >= 0):
            raise ValueError(f"model.aux_loss_weight must be a finite number >= 0 (0 = no aux head), "
                             f"got {self.aux_loss_weight}")
        if self.head_channels < 1:
            raise ValueError(f"model.head_channels must be >= 1, got {self.head_channels}")


@dataclass
class DeepLabV3PlusOptions(DeepLabOptions):
    """DeepLabV3+'s: DeepLab's and the decoder's output stride."""

    # Output stride of the decoder's logits. 4 = the paper's decoder on layer1 features; 2 = a further stage on
    # the stem's features, for small images (64 px: 32x32 logits instead of 16x16).
    decoder_stride: int = 4

    def validate(self) -> None:
        """Raise ValueError naming the bad key."""
        super().validate()
        check_decoder_stride(self.decoder_stride)


def check_decoder_stride(decoder_stride: int) -> None:
    """The one decoder_stride rule (config validation and build_deeplab)."""
    if decoder_stride not in (2, 4):
        raise ValueError(f"model.decoder_stride must be 4 or 2, got {decoder_stride}")


def deeplab_head(in_channels: int, num_classes: int, rates: Sequence[int], channels: int = 256) -> nn.Sequential:
    """torchvision's DeepLabHead layout (same module indices and keys) with a configurable width."""
    return nn.Sequential(
        ASPP(in_channels, rates, channels),
        nn.Conv2d(channels, channels, 3, padding=1, bias=False),
        nn.BatchNorm2d(channels),
        nn.ReLU(),
        nn.Conv2d(channels, num_classes, 1),
    )


class DeepLabV3PlusHead(nn.Module):
    """ASPP on the deep features + decoder fusing 48-channel projected layer1 features (Chen et al. 2018).

    fine_channels > 0 adds a second decoder stage at output stride 2 that fuses the stem's features
    (conv1-bn-relu, before the max-pool): on small images a stride-4 decoder cannot place edges finely
    enough (64 px images: 16x16 logits; an oracle passing the true masks of `shapes_seg` through 16x16
    scores 0.93 mIoU, through 32x32 0.98). It costs one projection and one 3x3 conv of channels/2 outputs.
    """

    def __init__(self, in_channels: int, low_level_channels: int, num_classes: int, rates: Sequence[int],
                 channels: int = 256, fine_channels: int = 0) -> None:
        super().__init__()
        self.aspp = ASPP(in_channels, rates, channels)
        self.project = nn.Sequential(nn.Conv2d(low_level_channels, LOW_LEVEL_CHANNELS, 1, bias=False),
                                     nn.BatchNorm2d(LOW_LEVEL_CHANNELS), nn.ReLU())
        self.fuse = nn.Sequential(
            nn.Conv2d(channels + LOW_LEVEL_CHANNELS, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels), nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels), nn.ReLU(),
        )
        self.refine: nn.Module | None = None
        if fine_channels > 0:
            refined = max(channels // 2, 1)
            self.project_fine = nn.Sequential(nn.Conv2d(fine_channels, FINE_CHANNELS, 1, bias=False),
                                              nn.BatchNorm2d(FINE_CHANNELS), nn.ReLU())
            self.refine = nn.Sequential(nn.Conv2d(channels + FINE_CHANNELS, refined, 3, padding=1, bias=False),
                                        nn.BatchNorm2d(refined), nn.ReLU())
            channels = refined
        self.classifier = nn.Conv2d(channels, num_classes, 1)

    def forward(self, features: torch.Tensor, low_level: torch.Tensor,
                fine: torch.Tensor | None = None) -> torch.Tensor:
        """Logits at the low-level features' resolution (output stride 4), or the fine ones' (stride 2)."""
        x = self.aspp(features)
        x = F.interpolate(x, size=low_level.shape[-2:], mode="bilinear", align_corners=False)
        x = self.fuse(torch.cat([x, self.project(low_level)], dim=1))
        if self.refine is not None:
            if fine is None:
                raise ValueError("this DeepLabV3+ head has a stride-2 stage: pass the stem's features as `fine`")
            x = F.interpolate(x, size=fine.shape[-2:], mode="bilinear", align_corners=False)
            x = self.refine(torch.cat([x, self.project_fine(fine)], dim=1))
        return self.classifier(x)


class DeepLabV3Plus(nn.Module):
    """backbone -> DeepLabV3PlusHead; forward(x) -> {"out": [N,K,H,W], "aux": ... when an aux head exists}."""

    def __init__(self, backbone: nn.Module, classifier: DeepLabV3PlusHead, aux_classifier: nn.Module | None) -> None:
        super().__init__()
        self.backbone = backbone
        self.classifier = classifier
        self.aux_classifier = aux_classifier

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Same output contract as torchvision's DeepLabV3: logits upsampled to the input size."""
        size = x.shape[-2:]
        features = self.backbone(x)
        result = OrderedDict()
        out = self.classifier(features["out"], features["low_level"], features.get("fine"))
        result["out"] = F.interpolate(out, size=size, mode="bilinear", align_corners=False)
        if self.aux_classifier is not None:
            aux = self.aux_classifier(features["aux"])
            result["aux"] = F.interpolate(aux, size=size, mode="bilinear", align_corners=False)
        return result


def build_deeplab(name: str, num_classes: int, norm_layer: NormLayer, output_stride: int = 16,
                  aux: bool = False, head_channels: int = 256, zero_init_residual: bool = False,
                  decoder_stride: int = 4) -> nn.Module:
    """DeepLabV3 ("deeplabv3_<resnet>") or DeepLabV3+ ("deeplabv3plus_<resnet>") with norm_layer everywhere.

    decoder_stride (DeepLabV3+ only): 4 = the paper's decoder on layer1; 2 = also a stage on the stem's features.
    """
    variant, backbone_name = name.split("_", 1)
    check_decoder_stride(decoder_stride)
    if decoder_stride != 4 and variant != "deeplabv3plus":
        raise ValueError(f"decoder_stride={decoder_stride} applies only to DeepLabV3+ (deeplabv3plus_*); "
                         f"use decoder_stride=4 for {name}")
    dilate, rates = OUTPUT_STRIDES[output_stride]
    resnet = build_dilated_resnet(backbone_name, norm_layer, dilate, zero_init_residual)
    channels = feature_channels(backbone_name)
    return_layers = {"layer4": "out"}
    if aux:
        return_layers["layer3"] = "aux"
    if variant == "deeplabv3plus":
        return_layers["layer1"] = "low_level"
        if decoder_stride == 2:
            return_layers["relu"] = "fine"  # the stem's conv1-bn1-relu output, before the max-pool
    backbone = IntermediateLayerGetter(resnet, return_layers=return_layers)  # drops avgpool and fc
    aux_classifier = FCNHead(channels["layer3"], num_classes) if aux else None
    if variant == "deeplabv3":
        model: nn.Module = DeepLabV3(backbone, deeplab_head(channels["layer4"], num_classes, rates, head_channels),
                                     aux_classifier)
    else:
        head = DeepLabV3PlusHead(channels["layer4"], channels["layer1"], num_classes, rates, head_channels,
                                 fine_channels=channels["stem"] if decoder_stride == 2 else 0)
        model = DeepLabV3Plus(backbone, head, aux_classifier)
    # torchvision's ASPP, DeepLabHead and FCNHead hard-code nn.BatchNorm2d: swap in the configured norm.
    model.classifier = replace_batchnorm2d(model.classifier, norm_layer)
    if model.aux_classifier is not None:
        model.aux_classifier = replace_batchnorm2d(model.aux_classifier, norm_layer)
    return model


def _builder(name: str) -> Callable[[ModelConfig, NormConfig, int], nn.Module]:
    def build(cfg: ModelConfig, norm_cfg: NormConfig, num_classes: int) -> nn.Module:
        """This DeepLab variant and backbone with the configured norm and head options."""
        return build_deeplab(name, num_classes, norm_layer_factory(norm_cfg), cfg.output_stride,
                             aux=cfg.aux_loss_weight > 0, head_channels=cfg.head_channels,
                             zero_init_residual=cfg.zero_init_residual, decoder_stride=getattr(cfg, "decoder_stride", 4))
    return build


def _backbone_stages(model: nn.Module) -> list[str]:
    """trainer.activation_checkpointing: the ResNet trunk's stages (the heads run once, as they are)."""
    return resnet_stages(model.backbone, prefix="backbone.")


# Per-pixel logits (every task that reads them); the backbone's ImageNet weights by name.
FAMILIES = {variant: ModelFamily(variant, output=PIXEL_LOGITS, options=options,
                                 weights_builder=backbone_weights_builder, checkpoint_stages=_backbone_stages)
            for variant, options in (("deeplabv3", DeepLabOptions), ("deeplabv3plus", DeepLabV3PlusOptions))}

for _variant, _family in FAMILIES.items():
    for _backbone in BACKBONES:
        MODELS.register(f"{_variant}_{_backbone}", family=_family, backbone=_backbone, backbone_attr="backbone")(
            _builder(f"{_variant}_{_backbone}"))
