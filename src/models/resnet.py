"""torchvision ResNets with an injected norm layer: classifiers, and dilated backbones for DeepLab."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from torch import nn
from torchvision.models import resnet as tv_resnet

from src.models.activation_checkpointing import resnet_stages
from src.models.config import ModelConfig, NormConfig
from src.models.norms import NormLayer, norm_layer_factory
from src.models.registry import IMAGE_LOGITS, MODELS, ModelFamily

# (block, blocks per stage) as in torchvision.models.resnet18 ... resnet152.
_LAYOUTS: dict[str, tuple[str, list[int]]] = {
    "resnet18": ("basic", [2, 2, 2, 2]),
    "resnet34": ("basic", [3, 4, 6, 3]),
    "resnet50": ("bottleneck", [3, 4, 6, 3]),
    "resnet101": ("bottleneck", [3, 4, 23, 3]),
    "resnet152": ("bottleneck", [3, 8, 36, 3]),
}


def build_resnet_classifier(name: str, num_classes: int, norm_layer: NormLayer,
                            zero_init_residual: bool = False) -> tv_resnet.ResNet:
    """torchvision.models.<name>(weights=None) with our norm layer; forward(x) -> logits [N, num_classes]."""
    builder = getattr(tv_resnet, name)
    return builder(weights=None, num_classes=num_classes, norm_layer=norm_layer,
                   zero_init_residual=zero_init_residual)


def _classifier_builder(name: str) -> Callable[[ModelConfig, NormConfig, int], tv_resnet.ResNet]:
    def build(cfg: ModelConfig, norm_cfg: NormConfig, num_classes: int) -> tv_resnet.ResNet:
        """torchvision's ImageNet ResNet of this depth with the configured norm."""
        return build_resnet_classifier(name, num_classes, norm_layer_factory(norm_cfg), cfg.zero_init_residual)
    return build


def _torchvision_builder(cfg: ModelConfig, key: str) -> str:
    """Our ImageNet ResNets are torchvision's, with the same state_dict keys: the weights of its builder of the same
    name (model.weights=DEFAULT; model.backbone_weights=DEFAULT leaves the head to train)."""
    return cfg.name


# ImageNet classifiers: every task that reads per-image logits; torchvision's weights by name; stages layer1..4.
RESNET = ModelFamily("resnet", output=IMAGE_LOGITS, weights_builder=_torchvision_builder,
                     checkpoint_stages=resnet_stages)

for _name in _LAYOUTS:
    MODELS.register(_name, family=RESNET)(_classifier_builder(_name))


def _set_dilation(conv: nn.Conv2d, dilation: int) -> None:
    """Dilate a 3x3 conv in place, keeping the output size ("same" padding); touches no RNG."""
    conv.dilation = (dilation, dilation)
    conv.padding = (dilation, dilation)


class DilatedBasicBlock(tv_resnet.BasicBlock):
    """torchvision's BasicBlock with dilation support (same parameters and state_dict keys).

    torchvision's BasicBlock raises "Dilation > 1 not supported in BasicBlock", so ResNet-18/34 cannot
    trade stride for dilation (DeepLab output stride 8/16). Both 3x3 convs are dilated: when a stage's
    stride is removed, every conv that used to run at the lower resolution must sample `dilation` pixels
    apart to keep the receptive field of the strided network (Yu et al., "Dilated Residual Networks").
    """

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: Optional[nn.Module] = None,
                 groups: int = 1, base_width: int = 64, dilation: int = 1,
                 norm_layer: Optional[NormLayer] = None) -> None:
        super().__init__(inplanes, planes, stride, downsample, groups, base_width, 1, norm_layer)
        _set_dilation(self.conv1, dilation)
        _set_dilation(self.conv2, dilation)


class DilatedResNet(tv_resnet.ResNet):
    """torchvision ResNet whose first block of a dilated stage dilates conv2 by the stage's new dilation.

    torchvision passes the *previous* dilation to a stage's first block. That is right for Bottleneck (its
    only 3x3 conv is the one that carried the stride) but not for a BasicBlock, whose conv2 runs after the
    removed stride and so needs the stage's new dilation.
    """

    def _make_layer(self, block: Any, planes: int, blocks: int, stride: int = 1,
                    dilate: bool = False) -> nn.Sequential:
        layer = super()._make_layer(block, planes, blocks, stride, dilate)
        if dilate and issubclass(block, DilatedBasicBlock):
            _set_dilation(layer[0].conv2, self.dilation)  # self.dilation was updated by super()
        return layer


def build_dilated_resnet(name: str, norm_layer: NormLayer, dilate: Sequence[bool],
                         zero_init_residual: bool = False) -> DilatedResNet:
    """ResNet trunk for DeepLab; dilate = replace_stride_with_dilation for layer2..layer4."""
    kind, layers = _LAYOUTS[name]
    block = DilatedBasicBlock if kind == "basic" else tv_resnet.Bottleneck
    return DilatedResNet(block, layers, replace_stride_with_dilation=list(dilate), norm_layer=norm_layer,
                         zero_init_residual=zero_init_residual)


def feature_channels(name: str) -> dict[str, int]:
    """Output channels of the stem (conv1) / layer1 / layer3 / layer4 for a ResNet name."""
    expansion = 1 if _LAYOUTS[name][0] == "basic" else 4
    return {"stem": 64, "layer1": 64 * expansion, "layer3": 256 * expansion, "layer4": 512 * expansion}
