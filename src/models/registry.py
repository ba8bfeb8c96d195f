"""MODELS: every value `model.name` can take, each registered by the module that builds it.

A builder is `builder(cfg: ModelConfig, norm_cfg: NormConfig, num_classes: int) -> nn.Module`: it
returns the network with norm_cfg's kind of norm layer in every norm position (the synchronised kinds,
syncbn and torch_syncbn, are built as nn.BatchNorm2d and converted afterwards by build_model). The
entry's task (a task registered in src/tasks/) decides the loss, the metrics and which datasets fit.
Optional entry info: `family` (names a group of models for option checks), `options` (the dataclass of the
keys this family adds to the `model` group, e.g. model.output_stride; its `validate()` checks them, and
src/models/config.py's model_schema() adds them to the schema), `arch=True` (the model is chosen by
`model.arch`, e.g. model=timm), `check` (a function(cfg) raising ValueError for rules across options),
`backbone` (the torchvision ResNet inside, whose weights names model.backbone_weights takes) with
`backbone_attr` (its dotted path in the model, where model.backbone_weights are loaded; without it they load
into the whole model minus its head).
"""
from __future__ import annotations

from src.registry import Registry

MODELS = Registry("model.name")
