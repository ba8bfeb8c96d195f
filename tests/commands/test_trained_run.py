"""load_trained_run: one reader of a finished checkpoint for evaluate.py, predict.py and export."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from src.config import TrainConfig
from src.commands.trained_run import load_trained_run
from src.models import count_norm_layers
from tests.engine.legacy_checkpoint import write_format_v0


def test_a_syncbn_checkpoint_is_rebuilt_as_batchnorm_with_its_weights_in_eval_mode(tmp_path: Path) -> None:
    ckpt = tmp_path / "last.pt"
    stored = write_format_v0(ckpt, ["model=resnet20", "norm=syncbn", "data.image_size=16", "trainer.ema=true"],
                             epoch=1, step=4, steps_per_epoch=4)
    run = load_trained_run(str(ckpt), device=torch.device("cpu"), overrides={"trainer": {"num_threads": 1}})
    assert isinstance(run.config, TrainConfig) and run.task.name == "classification" and run.task is run.config.resolved_task
    # Eval-mode SyncBN is F.batch_norm with the running statistics, exactly as nn.BatchNorm2d computes it.
    assert (run.trained_norm, run.config.norm.name) == ("syncbn", "bn")
    assert count_norm_layers(run.model) == {"BatchNorm2d": 19} and not run.model.training
    assert run.config.trainer.num_threads == 1  # the override reached the typed config
    # An end-of-epoch checkpoint (epoch 1, micro-batch 0) holds the weights of epoch 0's last step.
    assert (run.epoch, run.step, run.path, run.weights) == (0, 4, ckpt, "model")
    classes = stored["model"]["fc.weight"].shape[0]
    assert run.class_names == [str(i) for i in range(classes)]  # format 0 stores no names: counted from the weights
    for name, value in run.model.state_dict().items():
        assert torch.equal(value, stored["model"][name]), name

    ema = load_trained_run(ckpt, ema=True, device=torch.device("cpu"))
    assert ema.weights == "ema"
    assert torch.equal(ema.model.state_dict()["fc.weight"], stored["ema"]["module.fc.weight"])


def test_a_missing_file_names_the_key_and_a_foreign_one_says_what_it_is(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"ckpt=.*nope.pt: no such file"):
        load_trained_run(tmp_path / "nope.pt")
    with pytest.raises(FileNotFoundError, match=r"export.ckpt=.*nope.pt: no such file"):
        load_trained_run(tmp_path / "nope.pt", key="export.ckpt")
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(2)}, foreign)
    with pytest.raises(ValueError, match="not a SyncTrain checkpoint"):
        load_trained_run(foreign)


def test_a_run_saved_when_the_trackers_group_was_named_logger_still_loads(tmp_path: Path) -> None:
    ckpt = tmp_path / "last.pt"
    stored = write_format_v0(ckpt, ["model=resnet20", "norm=bn", "data.image_size=16", "tracker=[tensorboard,mlflow]",
                                     "tracker.mlflow.experiment=old"], epoch=1, step=4, steps_per_epoch=4)
    config = {("logger" if k == "tracker" else k): v for k, v in stored["config"].items()}
    assert "tracker" not in config  # as such a checkpoint was written
    torch.save({**stored, "config": config}, ckpt)
    run = load_trained_run(ckpt, device=torch.device("cpu"), overrides={"trainer": {"num_threads": 1}})
    assert run.config.tracker.enabled() == ["tensorboard", "mlflow"] and run.config.tracker.mlflow.experiment == "old"
