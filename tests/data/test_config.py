"""DataConfig: every registered dataset has its conf/data file, a valid DataConfig; bad values name the key."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from src.config import data_config, validate_config
from src.data import DATASETS, dataset_task
from src.data.config import DataConfig, coerce, data_schema, dataset_options
from src.tasks import task_models
from tests.support.task_data import build_datasets

CONF = Path(__file__).resolve().parents[2] / "conf" / "data"


def test_every_registered_dataset_has_a_config_file_and_every_file_a_dataset() -> None:
    """`data=NAME` is how a dataset is chosen: a registered one without conf/data/NAME.yaml cannot be, and a file
    without a registered builder fails only when used."""
    files = {p.stem for p in CONF.glob("*.yaml")}
    assert not set(DATASETS.names()) - files, f"registered without a file in {CONF}"
    assert not files - set(DATASETS.names()), "files of datasets that are not registered"


@pytest.mark.parametrize("name", sorted(DATASETS.names()))
def test_each_yaml_is_a_valid_structured_config(name: str) -> None:
    """With its dataset's and tasks' options (the run's schema), and validated with a model of its task."""
    node = OmegaConf.merge(OmegaConf.structured(type(data_config())), OmegaConf.load(CONF / f"{name}.yaml"))
    cfg = OmegaConf.to_object(node)
    assert isinstance(cfg, DataConfig) and cfg.name == name
    cfg.validate()
    model = task_models(dataset_task(name))[0]
    assert validate_config({"data": OmegaConf.to_container(node), "model": {"name": model}}).data == cfg


def test_the_data_layer_schema_holds_the_datasets_options() -> None:
    """coerce (a mapping or an OmegaConf node -> data_schema()) knows every registered dataset's keys."""
    schema = data_schema()
    assert {f.name for f in dataclasses.fields(schema)} >= {f.name for _, part in dataset_options()
                                                            for f in dataclasses.fields(part)}
    node = OmegaConf.merge(OmegaConf.structured(schema), {"name": "shapes", "batch_size": 3})
    assert coerce(node) == schema(name="shapes", batch_size=3) == coerce({"name": "shapes", "batch_size": 3})


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
    ({"mean": [0.5, 0.5]}, "data.mean"),
    ({"std": [0.2, 0.0, 0.2]}, "data.std"),
    ({"color_jitter": 2.0}, "data.color_jitter"),
    ({"name": "shapes", "download": True}, "data.download"),
])
def test_validation_names_the_key(overrides: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        data_config(**overrides).validate()


def test_resize_size_is_checked_by_the_task_that_reads_it() -> None:
    with pytest.raises(ValueError, match=r"data\.resize_size must be an integer >= 32, got 16"):
        validate_config({"data": {"name": "imagefolder", "resize_size": 16, "image_size": 32}})


def test_build_datasets_validates_first() -> None:
    with pytest.raises(ValueError, match=r"data\.batch_size"):
        build_datasets({"name": "shapes", "batch_size": 0}, seed=0)
