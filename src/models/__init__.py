"""Model builders: CIFAR and ImageNet ResNets, DeepLabV3/V3+, any timm or torchvision classifier; the configured
norm layer everywhere. Every name `model.name` can take is registered in MODELS (src/models/registry.py)."""

import importlib
import pkgutil

from src.models.build import as_config, build_model
from src.models.config import NORM_NAMES, ModelConfig, NormConfig, model_config, model_schema
from src.models.frozen_batchnorm import FrozenBatchNorm2d, FrozenBatchNormAct2d
from src.models.norms import NORM_TYPES, count_norm_layers
from src.models.param_groups import no_decay_parameter_names, param_groups
from src.models.registry import MODELS, ModelFamily, model_family, model_output
from src.models.weights import LoadReport, load_weights

__all__ = [
    "build_model", "as_config", "ModelConfig", "NormConfig", "MODELS", "ModelFamily", "model_family", "model_output",
    "NORM_NAMES", "model_config", "model_schema",
    "FrozenBatchNorm2d", "FrozenBatchNormAct2d", "NORM_TYPES", "count_norm_layers", "param_groups",
    "no_decay_parameter_names", "LoadReport", "load_weights",
]

# Every module of this package is imported, so the builders it registers in MODELS exist before any config
# is validated: adding a model is one decorated builder in a new file here (docs/models.md).
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
