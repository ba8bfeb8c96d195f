"""Model builders: CIFAR and ImageNet ResNets, DeepLabV3/V3+; the configured norm layer injected everywhere."""

from src.models.build import as_config, build_model, model_task
from src.models.config import (CLASSIFICATION_MODELS, MODEL_NAMES, NORM_NAMES, SEGMENTATION_MODELS, ModelConfig,
                               NormConfig)
from src.models.frozen_batchnorm import FrozenBatchNorm2d
from src.models.norms import NORM_TYPES, count_norm_layers
from src.models.param_groups import no_decay_parameter_names, param_groups
from src.models.weights import LoadReport, load_weights

__all__ = [
    "build_model", "model_task", "as_config", "ModelConfig", "NormConfig", "MODEL_NAMES", "NORM_NAMES",
    "CLASSIFICATION_MODELS", "SEGMENTATION_MODELS", "FrozenBatchNorm2d", "NORM_TYPES", "count_norm_layers",
    "param_groups", "no_decay_parameter_names", "LoadReport", "load_weights",
]
