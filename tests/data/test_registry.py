"""DATASETS: one registration per dataset is all validation, the task check and build_datasets need."""
from __future__ import annotations

import pkgutil

import pytest
from torch.utils.data import TensorDataset

import src.data.datasets
from src.config import data_config, validate_config
from src.data import DATASETS, DataConfig, Splits, dataset_task
from tests.support.task_data import build_datasets
from src.data.registry import Registry


def test_every_dataset_module_registers_and_every_name_has_a_task() -> None:
    modules = {m.name for m in pkgutil.walk_packages(src.data.datasets.__path__, "src.data.datasets.") if not m.ispkg}
    registered_by = {e.builder.__module__ for e in DATASETS}
    helpers = {"src.data.datasets.shapes.drawing", "src.data.datasets.shapes.datasets"}  # what the shapes sets share
    assert modules - helpers == registered_by  # no module without a dataset, none imported from elsewhere
    tasks = {"shapes": "classification", "imagefolder": "classification"}
    assert {n: dataset_task(n) for n in tasks} == tasks


def test_unknown_name_lists_every_registered_dataset() -> None:
    with pytest.raises(ValueError, match=r"data\.name must be one of .*imagefolder.*; got 'mnist'.*conf/data/"):
        dataset_task("mnist")
    with pytest.raises(ValueError, match=r"data\.name must be one of"):
        data_config(name="mnist").validate()


@pytest.fixture
def scratch_registry(monkeypatch: pytest.MonkeyPatch) -> Registry:
    """DATASETS with its current entries, restored after the test (registering is permanent otherwise)."""
    monkeypatch.setattr(DATASETS, "_entries", dict(DATASETS._entries))
    return DATASETS


def test_one_decorated_builder_is_a_complete_dataset(scratch_registry: Registry) -> None:
    import torch

    @scratch_registry.register("tiny", task="classification", num_classes=3, download=True)
    def build_tiny(cfg: DataConfig) -> Splits:
        images = torch.zeros(4, 3, 8, 8, dtype=torch.uint8)
        labels = torch.tensor([0, 1, 2, 0])
        return Splits(TensorDataset(images, labels), TensorDataset(images, labels), ["a", "b", "c"])

    bundle = build_datasets(data_config(name="tiny", image_size=8, download=True), seed=0)
    assert (bundle.task, bundle.num_classes, len(bundle.train)) == ("classification", 3, 4)
    with pytest.raises(ValueError, match=r"data\.num_classes=4 does not match tiny, which has 3"):
        data_config(name="tiny", num_classes=4).validate()
    assert validate_config({"data": {"name": "tiny", "image_size": 8}}).data.name == "tiny"
    # src/config/validation.py's task check reads the entries: a model of another task than the dataset's is refused.
    scratch_registry.register("tiny_depth", task="depth")(build_tiny)
    with pytest.raises(ValueError, match=r"model.name=resnet20 \(serves classification.*\) and data.name=tiny_depth "
                                         r"\(serves depth\) have no task in common"):
        validate_config({"data": {"name": "tiny_depth"}})
