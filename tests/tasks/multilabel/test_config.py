"""The run's task is the one model and dataset share: classification's models and yamls train multi-label with
every option they have, `task=` chooses where several tasks fit, an impossible pair is refused naming both."""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from src.config import validate_config
from src.data import DATASETS
from src.tasks import task_models

CONF = Path(__file__).resolve().parents[3] / "conf"
ML = ["data=shapes_multilabel"]


def _validate(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return validate_config(compose("train", overrides=list(overrides)))


@pytest.mark.parametrize("model", sorted(p.stem for p in (CONF / "model").glob("*.yaml")
                                         if p.stem in task_models("multilabel")))
def test_every_classifier_yaml_trains_multilabel(model: str) -> None:
    arch = ["model.arch=resnet18"] if model in ("timm", "torchvision") else []
    config = _validate(*ML, f"model={model}", *arch)
    assert config.task == "multilabel" and config.resolved_task.name == "multilabel"
    assert config.model.name == model


def test_the_models_options_hold_in_every_task_they_serve() -> None:
    """model.weights by name, a family's own keys and activation checkpointing: the same as for classification."""
    for data in ("data=shapes", *ML):
        assert _validate(data, "model=resnet50", "model.weights=DEFAULT").model.weights == "DEFAULT"
        assert _validate(data, "model.cifar_shortcut=B", "model.zero_init_residual=true").model.cifar_shortcut == "B"
        assert _validate(data, "trainer.activation_checkpointing=true").trainer.activation_checkpointing
        with pytest.raises(ValueError, match="only torchvision's ResNet family"):
            _validate(data, "model=torchvision", "model.arch=vgg11", "trainer.activation_checkpointing=true")
        with pytest.raises(ValueError, match="model.cifar_shortcut='B' is not read by model=resnet50"):
            _validate(data, "model=resnet50", "model.cifar_shortcut=B")


def test_an_impossible_pair_is_refused_naming_both(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(DATASETS, "_entries", dict(DATASETS._entries))  # the registry is process-wide: restored
    DATASETS.register("depth_maps", task="depth")(DATASETS.get("shapes").builder)  # a task no model serves
    with pytest.raises(ValueError, match=r"model.name=resnet20 \(serves classification and multilabel\) and "
                                         r"data.name=depth_maps \(serves depth\) have no task in common: pick a "
                                         r"dataset the model serves \(data=.*shapes_multilabel.*\) or a model of the "
                                         r"dataset's tasks \(model=none registered\)"):
        _validate("data.name=depth_maps")
    with pytest.raises(ValueError, match=r"task=classification does not fit model.name=resnet20 \(serves "
                                         r"classification and multilabel\) and data.name=shapes_multilabel \(serves "
                                         r"multilabel\): use task=multilabel or leave task unset"):
        _validate(*ML, "task=classification")
    with pytest.raises(ValueError, match=r"task 'depth' is not registered; registered tasks: .*multilabel"):
        _validate(*ML, "task=depth")


def test_task_chooses_where_model_and_dataset_share_several(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(DATASETS, "_entries", dict(DATASETS._entries))  # the registry is process-wide: restored
    DATASETS.register("tagged_shapes", task=("classification", "multilabel"))(DATASETS.get("shapes").builder)
    with pytest.raises(ValueError, match=r"fit several tasks \(classification, multilabel\): choose one with "
                                         r"task=<name>, e.g. task=classification"):
        _validate("data.name=tagged_shapes")
    for task in ("classification", "multilabel"):
        config = _validate("data.name=tagged_shapes", f"task={task}")
        assert config.task == task and config.resolved_task.name == task
