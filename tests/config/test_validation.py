"""Every config group option composes with Hydra's compose API and validates; bad configs fail with the key."""
from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from src.config import TrainConfig, refuse_renamed_groups, validate_config
from src.data import dataset_tasks
from src.errors import USER_ERROR_EXIT_CODE
from src.models import MODELS
from src.tasks import model_tasks

CONF = Path(__file__).resolve().parents[2] / "conf"


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def _compose(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose("train", overrides=overrides)


def _companions(group: str, option: str) -> list[str]:
    """Overrides that make `group=option` a coherent job: a model and a dataset of one task (the defaults,
    model=resnet20 and data=shapes, are classification's)."""
    if group == "model" and option in MODELS and "classification" not in model_tasks(option):
        task = model_tasks(option)[0]
        return [f"data={next(o for o in _options('data') if task in dataset_tasks(o))}"]
    if group == "data" and "classification" not in dataset_tasks(option):
        task = dataset_tasks(option)[0]
        return [f"model={next(o for o in _options('model') if o in MODELS and task in model_tasks(o))}"]
    return []


CASES = [(g, o) for g in ("model", "norm", "data", "optim", "sched", "trainer") for o in _options(g)]


@pytest.mark.parametrize("group,option", CASES, ids=[f"{g}={o}" for g, o in CASES])
def test_every_group_option_composes_and_validates(group: str, option: str) -> None:
    cfg = _compose([f"{group}={option}", *_companions(group, option)])
    if group == "norm" and option == "torch_syncbn" and not torch.cuda.is_available():
        with pytest.raises(ValueError, match="torch_syncbn"):
            validate_config(cfg)
        return
    checked = validate_config(cfg)
    assert isinstance(checked, TrainConfig)  # the typed config, the one form the run uses from here on
    part = getattr(checked, group)
    assert (part.epochs if group == "trainer" else part.name) is not None


@pytest.mark.parametrize("experiment", _options("experiment"))
def test_every_experiment_composes_and_validates(experiment: str) -> None:
    cfg = validate_config(_compose([f"experiment={experiment}"]))
    assert cfg.trainer.epochs >= 1
    # Its lr is for a stated batch, so another process count or batch size scales it (docs/training.md).
    assert cfg.optim.reference_batch_size is not None


def test_default_job_is_resnet20_syncbn_on_shapes() -> None:
    cfg = validate_config(_compose([]))
    assert (cfg.model.name, cfg.norm.name, cfg.data.name, cfg.optim.name, cfg.sched.name) == (
        "resnet20", "syncbn", "shapes", "sgd", "cosine")
    assert cfg.sched.warmup_epochs > 0
    assert (cfg.optim.lr, cfg.optim.reference_batch_size) == (0.2, 128)  # 2 processes x 64: the lr as given


def test_imagenet_recipe_is_torchvision_resnet50_v1() -> None:
    cfg = validate_config(_compose(["experiment=imagenet_resnet50"]))
    assert cfg.model.name == "resnet50" and cfg.data.name == "imagefolder"
    assert (cfg.optim.lr, cfg.optim.reference_batch_size, cfg.optim.momentum, cfg.optim.weight_decay) == (
        0.1, 256, 0.9, 1e-4)
    assert (cfg.trainer.epochs, cfg.sched.name, cfg.sched.step_epochs, cfg.sched.gamma) == (90, "step", 30, 0.1)


def test_unknown_key_is_rejected_at_composition_naming_it() -> None:
    with pytest.raises(ConfigCompositionException, match="epochz"):
        _compose(["trainer.epochz=3"])


@pytest.mark.parametrize("override,key", [("+trainer.foo=1", "trainer.foo"), ("+model.depthh=56", "model.depthh"),
                                          ("+seeed=3", "seeed")])
def test_unknown_key_forced_in_with_plus_is_rejected_naming_it(override: str, key: str) -> None:
    cfg = _compose([override])  # Hydra's `+` adds the key to the composed schema; validation must refuse it
    with pytest.raises(ValueError, match=f"'{key}'.*check its spelling"):
        validate_config(cfg)


def test_plus_still_adds_entries_to_the_free_form_model_kwargs() -> None:
    cfg = validate_config(_compose(["model=timm", "model.arch=resnet18", "+model.kwargs.drop_path_rate=0.1"]))
    assert cfg.model.kwargs == {"drop_path_rate": 0.1}


def test_unknown_key_in_a_plain_dict_is_rejected_naming_it() -> None:
    raw = OmegaConf.to_container(_compose([]), resolve=True)
    raw["trainer"]["grad_acum_steps"] = 2
    with pytest.raises(ValueError, match="grad_acum_steps"):
        validate_config(raw)


@pytest.mark.parametrize("override,key", [
    ("trainer.grad_accum_steps=0", "trainer.grad_accum_steps"),
    ("trainer.amp=fp8", "trainer.amp"),
    ("trainer.max_steps=-5", "trainer.max_steps"),
    ("optim.lr=0", "optim.lr"),
    ("optim.name=lion", "optim.name"),
    ("sched.name=linear", "sched.name"),
    ("sched.milestones=[30,10]", "sched.milestones"),
    ("trainer.norm_buffer_sync=gather", "trainer.norm_buffer_sync"),
    ("data.batch_size=0", "data.batch_size"),
    ("norm.name=layernorm", "norm.name"),
    ("device=tpu", "device"),
    ("trainer.best_metric=miou", "trainer.best_metric"),
])
def test_bad_value_names_the_key(override: str, key: str) -> None:
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        validate_config(_compose([override]))


def test_float64_refuses_amp_and_reaches_the_schema() -> None:
    assert validate_config(_compose(["trainer.dtype=float64"])).trainer.dtype == "float64"
    assert validate_config(_compose([])).trainer.dtype == "float32"
    with pytest.raises(ValueError, match="trainer.dtype=float64 with trainer.amp=bf16.*set trainer.amp=none"):
        validate_config(_compose(["trainer.dtype=float64", "trainer.amp=bf16"]))
    with pytest.raises(ValueError, match="trainer.dtype must be one of"):
        validate_config(_compose(["trainer.dtype=float16"]))


def test_wrong_type_names_the_key() -> None:
    with pytest.raises((ConfigCompositionException, ValueError), match="epochs"):
        validate_config(_compose(["trainer.epochs=ten"]))


def test_activation_checkpointing_refuses_compile_and_unknown_torchvision_stages() -> None:
    on = "trainer.activation_checkpointing=true"
    assert validate_config(_compose([on])).trainer.activation_checkpointing is True
    assert validate_config(_compose([])).trainer.activation_checkpointing is False
    with pytest.raises(ValueError, match="activation_checkpointing=true cannot be combined with trainer.compile"):
        validate_config(_compose([on, "trainer.compile=true"]))
    assert validate_config(_compose([on, "model=torchvision", "model.arch=resnext50_32x4d"]))
    with pytest.raises(ValueError, match="model.arch=vgg11: only torchvision's ResNet family"):
        validate_config(_compose([on, "model=torchvision", "model.arch=vgg11"]))


@pytest.mark.parametrize("script,override,fixed", [
    ("train.py", "logger=[tensorboard,mlflow]", "tracker=[tensorboard,mlflow]"),
    ("evaluate.py", "+logger.mlflow.experiment=x", "+tracker.mlflow.experiment=x"),
    ("predict.py", "logger.queue_size=3", "tracker.queue_size=3"),
    ("export.py", "~logger", "~tracker"),
])
def test_the_old_trackers_group_name_is_refused_by_every_entry_point_naming_the_new_one(
        script: str, override: str, fixed: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # The script runs as `python SCRIPT ARGS` would: the refusal comes before Hydra (whose own errors exit
    # with a number, not this message) and before any process group.
    monkeypatch.setattr(sys, "argv", [script, "trainer.num_threads=1", override])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(CONF.parent / script), run_name="__main__")
    message = capsys.readouterr().err
    assert exit_.value.code == USER_ERROR_EXIT_CODE and message.count("\n") == 1, message
    assert "config group is now `tracker`" in message and "tracker=[tensorboard,mlflow]" in message
    assert f"(here: {fixed})" in message
    refuse_renamed_groups(["tracker=mlflow", "loggers=1", "trainer.logger=1", "-m", "hydra/job_logging=none"])
