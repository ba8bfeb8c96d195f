"""CIFAR ResNets (He et al. 2016, "Deep Residual Learning", section 4.2): ResNet-20/32/44/56/110/1202.

Hand-written because torchvision only has the ImageNet layout (7x7 stem, max-pool, 4 stages, 64-512
channels). Here: 3x3 conv stem with 16 channels, 3 stages of n basic blocks with 16/32/64 channels and
strides 1/2/2, global average pooling, one linear layer; depth = 6n + 2.
Shortcuts: option A (the paper's CIFAR choice, parameter-free: stride-2 subsampling and zero-padded
channels; 0.27M/0.85M/1.7M parameters for ResNet-20/56/110) or option B (1x1 conv + norm projection
where the shape changes, identity elsewhere).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from src.models.activation_checkpointing import resnet_stages
from src.models.config import ModelConfig, NormConfig
from src.models.norms import NormLayer, norm_layer_factory
from src.models.registry import IMAGE_LOGITS, MODELS, ModelFamily

DEPTHS = (20, 32, 44, 56, 110, 1202)


class PadShortcut(nn.Module):
    """Option-A shortcut: x[:, :, ::stride, ::stride] with extra channels filled with zeros."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.extra = out_channels - in_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, :, ::self.stride, ::self.stride]
        # Zero channels appended after the existing ones, as fb.resnet.torch's shortcutType 'A' does.
        return F.pad(x, (0, 0, 0, 0, 0, self.extra))


class CifarBasicBlock(nn.Module):
    """Two 3x3 convs with norm and ReLU, plus a shortcut."""

    def __init__(self, in_channels: int, channels: int, stride: int, norm_layer: NormLayer, shortcut: str) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = norm_layer(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = norm_layer(channels)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != channels:
            if shortcut == "A":
                self.shortcut = PadShortcut(in_channels, channels, stride)
            else:
                self.shortcut = nn.Sequential(nn.Conv2d(in_channels, channels, 1, stride=stride, bias=False),
                                              norm_layer(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet-(6n+2) for 32x32 inputs; forward(x) -> logits [N, num_classes]."""

    def __init__(self, depth: int, num_classes: int, norm_layer: NormLayer, shortcut: str = "A",
                 zero_init_residual: bool = False) -> None:
        super().__init__()
        if (depth - 2) % 6:
            raise ValueError(f"CIFAR ResNet depth must be 6n+2 (20, 32, 44, 56, 110, 1202), got {depth}")
        blocks = (depth - 2) // 6
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = norm_layer(16)
        self.relu = nn.ReLU(inplace=True)
        layers, in_channels = [], 16
        for channels, stride in ((16, 1), (32, 2), (64, 2)):
            stage = []
            for i in range(blocks):
                stage.append(CifarBasicBlock(in_channels, channels, stride if i == 0 else 1, norm_layer, shortcut))
                in_channels = channels
            layers.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3 = layers
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, num_classes)

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        if zero_init_residual:  # each block starts as the identity (Goyal et al. 2017)
            for m in self.modules():
                if isinstance(m, CifarBasicBlock) and getattr(m.bn2, "weight", None) is not None:
                    nn.init.zeros_(m.bn2.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def _builder(depth: int) -> Callable[[ModelConfig, NormConfig, int], CifarResNet]:
    def build(cfg: ModelConfig, norm_cfg: NormConfig, num_classes: int) -> CifarResNet:
        """CIFAR ResNet of this depth with the configured norm, shortcut kind and zero-init."""
        return CifarResNet(depth, num_classes, norm_layer_factory(norm_cfg), cfg.cifar_shortcut, cfg.zero_init_residual)
    return build


@dataclass
class CifarResNetOptions:
    """The `model` key the CIFAR ResNets read."""

    # "A" = parameter-free identity shortcut with zero-padded channels (the paper's CIFAR choice, 0.27M params
    # for ResNet-20), "B" = 1x1 conv + norm projection when the shape changes.
    cifar_shortcut: str = "A"

    def validate(self) -> None:
        """Raise ValueError naming the bad key."""
        if self.cifar_shortcut not in ("A", "B"):
            raise ValueError(f"model.cifar_shortcut must be A or B, got {self.cifar_shortcut!r}")


# Classifiers: they serve every task that reads per-image logits (classification, multi-label, ...).
CIFAR_RESNET = ModelFamily("cifar_resnet", output=IMAGE_LOGITS, options=CifarResNetOptions,
                           checkpoint_stages=resnet_stages)

for _depth in DEPTHS:
    MODELS.register(f"resnet{_depth}", family=CIFAR_RESNET)(_builder(_depth))
