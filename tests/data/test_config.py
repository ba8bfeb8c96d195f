"""DataConfig: every conf/data file is a valid DataConfig; bad values name the key."""
from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.support.task_data import build_datasets
from src.data.config import DataConfig, coerce

CONF = Path(__file__).resolve().parents[2] / "conf" / "data"


@pytest.mark.parametrize("name", sorted(p.stem for p in CONF.glob("*.yaml")))
def test_each_yaml_is_a_valid_structured_config(name: str) -> None:
    node = OmegaConf.merge(OmegaConf.structured(DataConfig), OmegaConf.load(CONF / f"{name}.yaml"))
    cfg = OmegaConf.to_object(node)
    assert isinstance(cfg, DataConfig) and cfg.name == name
    cfg.validate()
    assert coerce(node) == cfg


def test_unknown_key_rejected_by_schema_and_by_coerce() -> None:
    with pytest.raises(Exception, match="batchsize"):
        OmegaConf.merge(OmegaConf.structured(DataConfig), {"batchsize": 3})
    with pytest.raises(ValueError, match="data.batchsize"):
        coerce({"name": "shapes", "batchsize": 3})


@pytest.mark.parametrize("overrides,key", [
    ({"name": "mnist"}, "data.name"),
    ({"batch_size": 0}, "data.batch_size"),
    ({"eval_batch_size": -1}, "data.eval_batch_size"),
    ({"num_workers": -1}, "data.num_workers"),
    ({"train_size": 0}, "data.train_size"),
    ({"image_size": 4}, "data.image_size"),
    ({"num_classes": 9}, "data.num_classes"),
    ({"name": "cifar10", "num_classes": 100}, "data.num_classes"),
    ({"scale_min": 2.0, "scale_max": 1.0}, "data.scale_min"),
    ({"mean": [0.5, 0.5]}, "data.mean"),
    ({"std": [0.2, 0.0, 0.2]}, "data.std"),
    ({"min_shapes": 3, "max_shapes": 2}, "data.min_shapes"),
    ({"color_jitter": 2.0}, "data.color_jitter"),
    ({"min_shape_size": 0.3, "max_shape_size": 0.2}, "data.min_shape_size"),
    ({"name": "shapes", "download": True}, "data.download"),
])
def test_validation_names_the_key(overrides: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        DataConfig(**overrides).validate()


def test_resize_size_is_checked_by_the_task_that_reads_it() -> None:
    from src.config import validate_config

    with pytest.raises(ValueError, match=r"data\.resize_size must be an integer >= 32, got 16"):
        validate_config({"data": {"name": "imagefolder", "resize_size": 16, "image_size": 32}})


def test_build_datasets_validates_first() -> None:
    with pytest.raises(ValueError, match=r"data\.batch_size"):
        build_datasets({"name": "shapes", "batch_size": 0}, seed=0)
