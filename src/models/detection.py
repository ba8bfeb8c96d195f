"""FCOS, RetinaNet and Faster R-CNN on ResNet-18/34/50 + FPN, from torchvision's detection models.

What differs from torchvision's `fcos_resnet50_fpn` & co., and why:
- The ResNet and the FPN take the configured norm (norm_layer_factory): trainable BatchNorm, so norm=syncbn
  synchronises the backbone's and the FPN's statistics (torchvision freezes the ResNet's BatchNorm and puts
  none in its FPN, which suits fine-tuning from ImageNet, not training from scratch). Every backbone layer
  trains. The FCOS and RetinaNet heads keep torchvision's GroupNorm(32): their statistics are per image and
  per level, so they neither need nor get synchronising; Faster R-CNN's heads have no norm layers.
- The input transform resizes only when model.detection_image_size is set (the longer side to that size);
  by default images keep the size the data gives them, so 96-128 px images are not upscaled to 800 px.
- Anchors fit small images: RetinaNet's start at 16 px on P3 (torchvision: 32), Faster R-CNN's at 16 px on
  P2 (torchvision: 32); FCOS keeps torchvision's P3-P7 scale ranges (points at strides 8-128).
- model.head_channels sets the FPN's and the heads' width (256 in the papers).

- FCOS and RetinaNet have no classification output for the background (ObjectClassesOnly).

The models keep torchvision's API: in training `model(images, targets)` -> dict of losses, in eval
`model(images)` -> [{"boxes", "scores", "labels"}] per image; images are float [3, H, W] in 0..1 (the
transform normalises them with ImageNet's mean and std), num_classes includes the background (label 0:
never a target's or a prediction's label; objects are 1..num_classes-1).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable, Optional

import torch
from torch import nn
from torchvision.models import resnet as tv_resnet
from torchvision.models.detection import FCOS, FasterRCNN, RetinaNet
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.backbone_utils import BackboneWithFPN
from torchvision.models.detection.retinanet import RetinaNetHead
from torchvision.models.detection.transform import GeneralizedRCNNTransform
from torchvision.ops import MultiScaleRoIAlign
from torchvision.ops.feature_pyramid_network import ExtraFPNBlock, LastLevelMaxPool, LastLevelP6P7
from torchvision.ops.poolers import initLevelMapper

from src.models.config import ModelConfig, NormConfig
from src.models.norms import NormLayer, norm_layer_factory
from src.models.pretrained import backbone_weights_builder
from src.models.registry import DETECTIONS, MODELS, ModelFamily
from src.models.resnet import feature_channels

Target = dict[str, torch.Tensor]  # {"boxes": float [K, 4] x1 y1 x2 y2 in pixels, "labels": int64 [K]}
BACKBONES = ("resnet18", "resnet34", "resnet50")
IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]
HEAD_GROUPS = 32  # the FCOS / RetinaNet heads' GroupNorm groups (torchvision's)
ROI_FPN_LEVELS = (2, 5)  # the R-CNN RoI poolers read P2 (stride 4) .. P5 (stride 32)
# The backbone ResNet's state_dict lives here (model.backbone_weights are loaded into it; `fc.*` is ignored).
BACKBONE_ATTR = "backbone.body"


class DetectionTransform(GeneralizedRCNNTransform):
    """torchvision's detection transform (normalise, resize, batch with zero padding to a multiple of 32),
    resizing only when a size is given: `size` scales every image so that its longer side is `size` pixels
    (torchvision's min_size = max_size = size), None keeps every image as it comes."""

    def __init__(self, size: Optional[int]) -> None:
        super().__init__(size or 1, size or 1, IMAGENET_MEAN, IMAGENET_STD)
        self.size = size

    def resize(self, image: torch.Tensor, target: Optional[Target] = None) -> tuple[torch.Tensor, Optional[Target]]:
        if self.size is None:
            return image, target
        return super().resize(image, target)

    def __repr__(self) -> str:
        resize = "none" if self.size is None else f"longer side to {self.size} px"
        return f"{type(self).__name__}(Normalize(mean={self.image_mean}, std={self.image_std}), Resize: {resize})"


def check_labels(targets: list[Target], num_object_classes: int) -> None:
    """ValueError unless every target label is an object class, 1..num_object_classes (torchvision would
    train label 0 as the background for Faster R-CNN, and a shifted -1 as the last class for FCOS)."""
    labels = torch.cat([t["labels"] for t in targets])
    if len(labels) and not bool(((labels >= 1) & (labels <= num_object_classes)).all()):
        raise ValueError(f"detection targets: labels must be 1..{num_object_classes} (0 is the background, which "
                         f"has no boxes); got labels {sorted(set(labels.tolist()))}")


class ObjectClassesOnly:
    """For the sigmoid-scored detectors (FCOS, RetinaNet): one classification output per object class.

    Their heads score every class with its own sigmoid; "background" is every score being low, not an
    output. torchvision's builders still give them an output for label 0, trained as a class that never
    occurs and still present in the predictions with low scores. Built with num_classes - 1 outputs
    instead, the targets' labels 1..num_classes-1 are shifted to 0..num_classes-2 for the loss and the
    predictions' back, so label 0 means background for every detector here, as for Faster R-CNN (softmax).
    """

    num_object_classes: int  # set by the builder: the head's outputs

    def compute_loss(self, targets: list[Target], *args: object) -> dict[str, torch.Tensor]:
        check_labels(targets, self.num_object_classes)
        shifted = [{**t, "labels": t["labels"] - 1} for t in targets]
        return super().compute_loss(shifted, *args)  # type: ignore[misc]

    def postprocess_detections(self, *args: object) -> list[Target]:
        detections = super().postprocess_detections(*args)  # type: ignore[misc]
        for detection in detections:
            detection["labels"] = detection["labels"] + 1
        return detections


class FCOSDetector(ObjectClassesOnly, FCOS):
    """torchvision's FCOS with one classification output per object class (ObjectClassesOnly)."""


class RetinaNetDetector(ObjectClassesOnly, RetinaNet):
    """torchvision's RetinaNet with one classification output per object class (ObjectClassesOnly)."""


class FasterRCNNDetector(FasterRCNN):
    """torchvision's Faster R-CNN, refusing targets whose labels are not object classes (check_labels)."""

    num_object_classes: int  # set by the builder: the box predictor's classes less the background

    def forward(self, images: list[torch.Tensor], targets: Optional[list[Target]] = None) -> object:
        if self.training and targets is not None:
            check_labels(targets, self.num_object_classes)
        return super().forward(images, targets)


def resnet_fpn(backbone: str, norm_layer: NormLayer, returned_layers: list[int], extra_blocks: ExtraFPNBlock,
               channels: int, zero_init_residual: bool = False) -> BackboneWithFPN:
    """torchvision's ResNet `backbone` (every layer trainable) with an FPN of `channels` on the stages
    `returned_layers` (1 = layer1, stride 4 ... 4 = layer4, stride 32); norm_layer in both."""
    resnet = getattr(tv_resnet, backbone)(weights=None, norm_layer=norm_layer, zero_init_residual=zero_init_residual)
    widths = feature_channels(backbone)
    stage_channels = {1: widths["layer1"], 2: widths["layer1"] * 2, 3: widths["layer3"], 4: widths["layer4"]}
    return BackboneWithFPN(resnet, {f"layer{k}": str(i) for i, k in enumerate(returned_layers)},
                           [stage_channels[k] for k in returned_layers], channels, extra_blocks=extra_blocks,
                           norm_layer=norm_layer)


def build_fcos(backbone: str, num_classes: int, norm_layer: NormLayer, channels: int = 256,
               image_size: Optional[int] = None, zero_init_residual: bool = False) -> FCOS:
    """FCOS (Tian et al. 2019) on P3-P7, as torchvision's fcos_resnet50_fpn: points at strides 8..128, each
    level regressing objects up to 8x its stride (P3: up to 64 px, P4: 64-128 px, ...)."""
    body = resnet_fpn(backbone, norm_layer, [2, 3, 4], LastLevelP6P7(channels, channels), channels,
                      zero_init_residual)
    model = FCOSDetector(body, num_classes - 1)
    model.num_object_classes = num_classes - 1
    model.transform = DetectionTransform(image_size)
    return model


def build_retinanet(backbone: str, num_classes: int, norm_layer: NormLayer, channels: int = 256,
                    image_size: Optional[int] = None, zero_init_residual: bool = False) -> RetinaNet:
    """RetinaNet (Lin et al. 2017) as torchvision's retinanet_resnet50_fpn_v2 (GroupNorm heads, GIoU box
    loss, P3-P7), with anchors of 16-256 px (3 scales x 3 aspect ratios per level) instead of 32-512."""
    body = resnet_fpn(backbone, norm_layer, [2, 3, 4], LastLevelP6P7(channels, channels), channels,
                      zero_init_residual)
    anchors = AnchorGenerator(tuple((s, int(s * 2 ** (1 / 3)), int(s * 2 ** (2 / 3))) for s in (16, 32, 64, 128, 256)),
                              ((0.5, 1.0, 2.0),) * 5)
    head = RetinaNetHead(channels, anchors.num_anchors_per_location()[0], num_classes - 1,
                         norm_layer=partial(nn.GroupNorm, HEAD_GROUPS))
    head.regression_head._loss_type = "giou"
    model = RetinaNetDetector(body, num_classes - 1, anchor_generator=anchors, head=head)
    model.num_object_classes = num_classes - 1
    model.transform = DetectionTransform(image_size)
    return model


def fix_pyramid_scales(pool: MultiScaleRoIAlign) -> None:
    """Give torchvision's RoI pooler the FPN's true scales, 1/4 .. 1/32 on P2-P5, instead of those it infers on its
    first call and keeps: it rounds log2(feature size / largest image size of that batch) to an integer, and on small
    images the padding to a multiple of 32 moves that ratio across a rounding boundary (a 40 px image is padded to 64,
    P2 is 16 px: 16 / 40 rounds to 1/2, not 1/4). Every later batch, in training and in evaluation, would then pool
    from the wrong places, and which batch came first would change the results."""
    levels = range(ROI_FPN_LEVELS[0], ROI_FPN_LEVELS[1] + 1)
    pool.scales = [2.0 ** -k for k in levels]
    pool.map_levels = initLevelMapper(ROI_FPN_LEVELS[0], ROI_FPN_LEVELS[1], pool.canonical_scale,
                                      pool.canonical_level)


def build_fasterrcnn(backbone: str, num_classes: int, norm_layer: NormLayer, channels: int = 256,
                     image_size: Optional[int] = None, zero_init_residual: bool = False) -> FasterRCNN:
    """Faster R-CNN (Ren et al. 2015) with an FPN on P2-P6 as torchvision's fasterrcnn_resnet50_fpn, with
    anchors of 16-256 px (3 aspect ratios per level) instead of 32-512 and 128 RoIs per image instead of 512."""
    body = resnet_fpn(backbone, norm_layer, [1, 2, 3, 4], LastLevelMaxPool(), channels, zero_init_residual)
    anchors = AnchorGenerator(((16,), (32,), (64,), (128,), (256,)), ((0.5, 1.0, 2.0),) * 5)
    # 128 sampled RoIs per image (torchvision: 512), as in Fast R-CNN: the box head's two 1024-wide layers
    # on 512 RoIs cost several times the whole backbone on a 128 px image.
    model = FasterRCNNDetector(body, num_classes, rpn_anchor_generator=anchors, box_batch_size_per_image=128)
    model.num_object_classes = num_classes - 1
    model.transform = DetectionTransform(image_size)
    fix_pyramid_scales(model.roi_heads.box_roi_pool)
    return model


# family -> (builder, whether its heads have torchvision's GroupNorm(32) layers)
FAMILIES: dict[str, tuple[Callable[..., nn.Module], bool]] = {
    "fcos": (build_fcos, True), "retinanet": (build_retinanet, True), "fasterrcnn": (build_fasterrcnn, False),
}


def check_group_norm_heads(cfg: ModelConfig) -> None:
    """FCOS / RetinaNet: the heads' GroupNorm(32) needs a width (model.head_channels) that 32 divides, with at
    least 2 channels per group: on P7, 1x1 for images up to 128 px, one channel per group is one value,
    which GroupNorm refuses for a single image."""
    if cfg.head_channels % HEAD_GROUPS or cfg.head_channels < 2 * HEAD_GROUPS:
        raise ValueError(f"model.head_channels={cfg.head_channels}: {cfg.name}'s FPN and head width must be a "
                         f"multiple of {HEAD_GROUPS} (the heads' GroupNorm groups) and at least {2 * HEAD_GROUPS} "
                         "(2 channels per group: P7 is 1x1 on small images), e.g. 128 or 256")


def _builder(family: str, backbone: str) -> Callable[[ModelConfig, NormConfig, int], nn.Module]:
    def build(cfg: ModelConfig, norm_cfg: NormConfig, num_classes: int) -> nn.Module:
        """This detector and backbone with the configured norm in the backbone and the FPN."""
        if num_classes < 2:
            raise ValueError(f"model={cfg.name} needs num_classes >= 2 (the background, label 0, and at least one "
                             f"object class); got {num_classes}")
        return FAMILIES[family][0](backbone, num_classes, norm_layer_factory(norm_cfg), cfg.head_channels,
                                   cfg.detection_image_size, cfg.zero_init_residual)
    return build


@dataclass
class DetectorOptions:
    """The `model` keys the detectors read (conf/model/{fcos,retinanet,fasterrcnn}_*.yaml)."""

    # Width of the FPN and the heads (256 in the papers and in torchvision; FCOS and RetinaNet need a multiple of
    # 32 >= 64: their heads use GroupNorm(32)).
    head_channels: int = 256
    # null = images keep the size the data gives them; S = each image is resized so that its longer side is S
    # pixels (torchvision's min_size = max_size = S), boxes with it, and back for predictions.
    detection_image_size: Optional[int] = None

    def validate(self) -> None:
        """Raise ValueError naming the bad key."""
        if self.head_channels < 1:
            raise ValueError(f"model.head_channels must be >= 1, got {self.head_channels}")
        if self.detection_image_size is not None and (not isinstance(self.detection_image_size, int)
                                                      or self.detection_image_size < 32):
            raise ValueError(f"model.detection_image_size must be an int >= 32 (pixels of an image's longer side) "
                             f"or null (keep the data's size), got {self.detection_image_size!r}")


def _register() -> None:
    for family, (_, group_norm_heads) in FAMILIES.items():
        # torchvision's detection protocol; the backbone's ImageNet weights by name; no stages known to the trainer.
        declared = ModelFamily(family, output=DETECTIONS, options=DetectorOptions,
                               check=check_group_norm_heads if group_norm_heads else None,
                               weights_builder=backbone_weights_builder)
        for backbone in BACKBONES:
            MODELS.register(f"{family}_{backbone}", family=declared, backbone=backbone, backbone_attr=BACKBONE_ATTR)(
                _builder(family, backbone))


_register()
