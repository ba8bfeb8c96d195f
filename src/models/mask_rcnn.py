"""Mask R-CNN on ResNet-18/34/50 + FPN, from torchvision's MaskRCNN: the instance-segmentation models.

Built as src/models/detection.py builds Faster R-CNN (its ResNet + FPN with the configured norm, so norm=syncbn
synchronises the backbone's and the FPN's statistics; every layer trains; anchors of 16-256 px; 128 sampled RoIs
per image; the input transform resizes only with model.detection_image_size), plus torchvision's mask branch:
RoIAlign 14x14 on P2-P5, four 3x3 convs and a 2x transposed conv to 28x28 per-class mask logits. The mask head's
convs are model.head_channels wide (256 in the paper), like the FPN, and carry no norm layers (as torchvision's
v1 model), so only the backbone and the FPN hold BatchNorm.

torchvision's API: in training `model(images, targets)` -> dict of losses (the box losses and "loss_mask"), with
targets {"boxes": float [K, 4] xyxy, "labels": int64 [K] in 1..num_classes-1, "masks": uint8 [K, H, W]}; in eval
`model(images)` -> per image {"boxes", "scores", "labels", "masks": float [N, 1, H, W] probabilities in the
input's pixels}.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import nn
from torchvision.models.detection import MaskRCNN
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor
from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor
from torchvision.ops.feature_pyramid_network import LastLevelMaxPool

from src.models.config import ModelConfig, NormConfig
from src.models.detection import (BACKBONE_ATTR, BACKBONES, DetectionTransform, DetectorOptions, Target, check_labels,
                                  fix_pyramid_scales, resnet_fpn)
from src.models.norms import NormLayer, norm_layer_factory
from src.models.pretrained import backbone_weights_builder
from src.models.registry import INSTANCES, MODELS, ModelFamily

MASK_HEAD_LAYERS = 4  # the mask head's 3x3 convs (Mask R-CNN's FPN head)
BOX_REPRESENTATION = 1024  # the box head's two fully connected layers' width (torchvision's TwoMLPHead)


class MaskRCNNSegmenter(MaskRCNN):
    """torchvision's Mask R-CNN, refusing targets whose labels are not object classes (check_labels) or that
    carry no masks."""

    num_object_classes: int  # set by the builder: the box predictor's classes less the background

    def forward(self, images: list[torch.Tensor], targets: Optional[list[Target]] = None) -> object:
        if self.training and targets is not None:
            check_labels(targets, self.num_object_classes)
            missing = [i for i, t in enumerate(targets) if "masks" not in t]
            if missing:
                raise ValueError(f"Mask R-CNN trains on targets with 'masks' (uint8 [K, H, W] per image); targets "
                                 f"{missing[:5]} have none: use an instance-segmentation dataset (data=shapes_inst)")
        return super().forward(images, targets)


def build_mask_rcnn(backbone: str, num_classes: int, norm_layer: NormLayer, channels: int = 256,
                    image_size: Optional[int] = None, zero_init_residual: bool = False) -> MaskRCNN:
    """Mask R-CNN (He et al. 2017) with an FPN on P2-P6 as torchvision's maskrcnn_resnet50_fpn, with anchors of
    16-256 px (3 aspect ratios per level) instead of 32-512, 128 RoIs per image instead of 512, and a mask head
    `channels` wide."""
    body = resnet_fpn(backbone, norm_layer, [1, 2, 3, 4], LastLevelMaxPool(), channels, zero_init_residual)
    anchors = AnchorGenerator(((16,), (32,), (64,), (128,), (256,)), ((0.5, 1.0, 2.0),) * 5)
    mask_head = MaskRCNNHeads(channels, (channels,) * MASK_HEAD_LAYERS, 1)
    # torchvision takes num_classes or the predictors: both predictors given, as its builder would make them.
    model = MaskRCNNSegmenter(body, None, rpn_anchor_generator=anchors, box_batch_size_per_image=128,
                              box_predictor=FastRCNNPredictor(BOX_REPRESENTATION, num_classes), mask_head=mask_head,
                              mask_predictor=MaskRCNNPredictor(channels, channels, num_classes))
    model.num_object_classes = num_classes - 1
    model.transform = DetectionTransform(image_size)
    for pool in (model.roi_heads.box_roi_pool, model.roi_heads.mask_roi_pool):
        fix_pyramid_scales(pool)
    return model


def _builder(backbone: str) -> Callable[[ModelConfig, NormConfig, int], nn.Module]:
    def build(cfg: ModelConfig, norm_cfg: NormConfig, num_classes: int) -> nn.Module:
        """Mask R-CNN on this backbone with the configured norm in the backbone and the FPN."""
        if num_classes < 2:
            raise ValueError(f"model={cfg.name} needs num_classes >= 2 (the background, label 0, and at least one "
                             f"object class); got {num_classes}")
        return build_mask_rcnn(backbone, num_classes, norm_layer_factory(norm_cfg), cfg.head_channels,
                               cfg.detection_image_size, cfg.zero_init_residual)
    return build


# torchvision's detection protocol with masks; the detectors' keys; the backbone's ImageNet weights by name.
MASKRCNN = ModelFamily("maskrcnn", output=INSTANCES, options=DetectorOptions, weights_builder=backbone_weights_builder)

for _backbone in BACKBONES:
    MODELS.register(f"maskrcnn_{_backbone}", family=MASKRCNN, backbone=_backbone, backbone_attr=BACKBONE_ATTR)(
        _builder(_backbone))
