"""MODELS: every value `model.name` can take, each registered by the module that builds it, with its family.

A builder is `builder(cfg: ModelConfig, norm_cfg: NormConfig, num_classes: int) -> nn.Module`: it returns the
network with norm_cfg's kind of norm layer in every norm position (the synchronised kinds, syncbn and torch_syncbn,
are built as nn.BatchNorm2d and converted afterwards by build_model). Every name belongs to a `ModelFamily`, which
says everything the rest of the project needs to know about its models, so that nothing outside the family's own
module asks for a family's or a model's name:

    CIFAR_RESNET = ModelFamily("cifar_resnet", output=IMAGE_LOGITS, options=CifarResNetOptions,
                               checkpoint_stages=resnet_stages)

    @MODELS.register("resnet20", family=CIFAR_RESNET)
    def build_resnet20(cfg, norm_cfg, num_classes): ...

What a family's models produce (`output`) decides which tasks they serve: every registered task whose
`Task.model_output` is that kind (src/tasks/), so a task added later reuses the models whose outputs fit it with
no edit here. Optional entry info, per name: `backbone` (the torchvision ResNet inside, whose weights names
model.backbone_weights takes) with `backbone_attr` (its dotted path in the model, where model.backbone_weights are
loaded; without it they load into the whole model minus its head).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from src.registry import Registry

# What a model returns, the kinds tasks read (Task.model_output). The eval-mode output; a family whose models
# compute their losses from the targets in training says so in its kind.
IMAGE_LOGITS = "image_logits"  # [N, K]: one score per class and image (classifiers)
PIXEL_LOGITS = "pixel_logits"  # [N, K, H, W] or {"out": ..., "aux": ...}: one score per class and pixel
# torchvision's detection protocol: training model(images, targets) -> dict of losses; eval model(images) -> per
# image {"boxes", "scores", "labels"} (DETECTIONS), and "masks" too (INSTANCES)
DETECTIONS = "detections"
INSTANCES = "instances"


@dataclass(frozen=True)
class ModelFamily:
    """What the models of one family share: what they produce, their own `model` keys, and the family's answers to
    the questions the config checks, the weights loader and the trainer ask (each None: the family has no such
    thing, and the asker says so)."""

    name: str  # named in messages (e.g. "model.cifar_shortcut applies to cifar_resnet models")
    output: str  # what its models return (IMAGE_LOGITS, ...): it serves every task that reads that
    # The dataclass of the keys this family adds to the `model` group (e.g. model.output_stride): its validate()
    # checks them, and src/models/config.py's model_schema() adds them to the schema.
    options: Optional[type] = None
    # The model is chosen by model.arch (model=timm, model=torchvision): a library's architecture with its own
    # BatchNorm eps and momentum (which norm.eps / norm.momentum then may not change).
    arch: bool = False
    check: Optional[Callable[[Any], None]] = None  # rules across its options, raising ValueError (cfg: ModelConfig)
    # model.weights / model.backbone_weights by name: (cfg, key) -> the torchvision builder whose weights enum holds
    # the name (e.g. "resnet50"); it may raise ValueError to refuse the key with the family's own advice.
    weights_builder: Optional[Callable[[Any, str], str]] = None
    # model.pretrained=true: cfg -> the local file of the library's pretrained weights (from its cache; downloaded
    # when missing, unless offline: then the error naming where the file goes).
    pretrained_file: Optional[Callable[[Any], str]] = None
    # trainer.activation_checkpointing: model -> the names of the regions it made recompute their activations
    # (src/models/activation_checkpointing.py); `checkpoint_check(cfg)` refuses a model of the family whose
    # stages are not known, before any process starts.
    checkpoint_stages: Optional[Callable[[Any], list[str]]] = None
    checkpoint_check: Optional[Callable[[Any], None]] = None


MODELS = Registry("model.name", requires="family")


def model_family(name: str) -> ModelFamily:
    """The family of `model.name`; ValueError naming the registered names otherwise."""
    return MODELS.get(name).info["family"]


def model_output(name: str) -> str:
    """What `model.name`'s models return (IMAGE_LOGITS, ...): the kind the tasks it serves read."""
    return model_family(name).output
