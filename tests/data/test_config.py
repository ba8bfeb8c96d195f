"""DataConfig: every registered dataset has its conf/data file, a valid DataConfig; bad values name the key."""
from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from src.data import DATASETS, build_datasets
from src.data.config import DataConfig, coerce

CONF = Path(__file__).resolve().parents[2] / "conf" / "data"


def test_every_registered_dataset_has_a_config_file_and_every_file_a_dataset() -> None:
    """`data=NAME` is how a dataset is chosen: a registered one without conf/data/NAME.yaml cannot be, and a file
    without a registered builder fails only when used."""
    files = {p.stem for p in CONF.glob("*.yaml")}
    assert not set(DATASETS.names()) - files, f"registered without a file in {CONF}"
    assert not files - set(DATASETS.names()), "files of datasets that are not registered"


@pytest.mark.parametrize("name", sorted(DATASETS.names()))
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
    ({"name": "shapes_seg", "num_classes": 2}, "data.num_classes"),
    ({"name": "cifar10", "num_classes": 100}, "data.num_classes"),
    ({"scale_min": 2.0, "scale_max": 1.0}, "data.scale_min"),
    ({"mean": [0.5, 0.5]}, "data.mean"),
    ({"std": [0.2, 0.0, 0.2]}, "data.std"),
    ({"min_shapes": 3, "max_shapes": 2}, "data.min_shapes"),
    ({"color_jitter": 2.0}, "data.color_jitter"),
    ({"min_shape_size": 0.3, "max_shape_size": 0.2}, "data.min_shape_size"),
    ({"name": "shapes", "download": True}, "data.download"),
    ({"name": "imagefolder", "resize_size": 16}, "data.resize_size"),
])
def test_validation_names_the_key(overrides: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        DataConfig(**overrides).validate()


def test_build_datasets_validates_first() -> None:
    with pytest.raises(ValueError, match=r"data\.batch_size"):
        build_datasets({"name": "shapes", "batch_size": 0}, seed=0)
