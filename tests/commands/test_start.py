"""src/commands/start.py in this process, without training: a folder that holds a run refuses a new one (saying what
it holds and the ways on) and keeps every byte; trainer.overwrite=true moves the old run aside; trainer.resume=<run
folder> takes the run's saved config plus the command line's resumable keys and refuses the rest, naming both values.
(The same decisions under torchrun, with training: tests/commands/test_train_resume.py.)"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from src.commands.run_folder import RunFolder
from src.commands.start import plan_start
from src.config import config_dict, validate_config
from src.errors import UserError
from tests.support.launch import REPO

RUN = ["norm=bn", "data.train_size=64", "data.batch_size=16", "device=cpu", "seed=3", "trainer.epochs=2"]


def _compose(overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return compose("train", overrides=overrides, return_hydra_config=True)


def _saved_run(folder: Path, overrides: list[str] = RUN, world_size: int = 2, step: int = 8) -> dict[str, Any]:
    """A run folder as a start that passed its checks leaves it, with a last.pt of `world_size` processes."""
    cfg = _compose([*overrides, f"hydra.run.dir={folder}"])
    config = config_dict(validate_config(cfg))
    RunFolder(folder).write_saved(config, overrides, {"hydra": {"runtime": {"choices": {"norm": "bn", "data": "shapes",
                                                                                        "model": "resnet20"}}}})
    (folder / "checkpoints").mkdir()
    torch.save({"config": config, "model": {}, "step": step, "world_size": world_size, "metrics": {"top1": 93.5},
                "best": [[93.5, f"best_step{step:07d}_top193.5000.pt"]]}, folder / "checkpoints" / "last.pt")
    (folder / "metrics.jsonl").write_text('{"split": "train", "epoch": 0, "step": 8, "loss": 1.0}\n')
    return config


def _hashes(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_new_run_is_refused_in_a_folder_that_holds_one_and_changes_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    _saved_run(folder)
    before = _hashes(folder)
    with pytest.raises(UserError) as refused:
        plan_start(_compose([*RUN, f"hydra.run.dir={folder}"]), world_size=2)
    message = str(refused.value)
    for said in (f"hydra.run.dir={folder} already holds a run (step 8", "best top1=93.5 (checkpoints/best_step0000008",
                 f"trainer.resume={folder}", "hydra.run.dir=<a new folder>", "trainer.overwrite=true",
                 f"{folder}/previous/<its date>/, deletes nothing"):
        assert said in message, message
    assert _hashes(folder) == before


@pytest.mark.usefixtures("restores_process_state")  # the commit logs into the folder (logging handlers)
def test_overwrite_moves_the_old_run_aside_at_the_commit_and_deletes_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    _saved_run(folder)
    before = _hashes(folder)
    plan = plan_start(_compose([*RUN, "trainer.epochs=3", "trainer.overwrite=true", f"hydra.run.dir={folder}"]),
                      world_size=1)
    assert plan.replace_old_run and plan.checkpoint is None and _hashes(folder) == before  # nothing yet
    plan.commit(folder)
    (moved,) = (folder / "previous").iterdir()
    assert {f"previous/{moved.name}/{k}": v for k, v in before.items()}.items() <= _hashes(folder).items()
    assert sorted(p.name for p in folder.iterdir()) == [".hydra", "logs", "previous"]  # the new run's start
    assert RunFolder(folder).saved_config(None)["trainer"]["epochs"] == 3


@pytest.mark.parametrize("overrides, said", [
    (["trainer.overwrite=true", "trainer.resume=auto"], "cannot be combined with trainer.resume=auto"),
    (["trainer.resume=/nonexistent/run"], "trainer.resume=/nonexistent/run: no such file or folder"),
])
def test_contradictions_and_missing_resume_targets_are_refused(overrides: list[str], said: str) -> None:
    with pytest.raises(UserError, match=said):
        plan_start(_compose([*RUN, *overrides]), world_size=1)


def test_resume_targets_that_are_no_run_or_another_folder_are_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="the folder holds no run to continue"):
        plan_start(_compose([f"trainer.resume={tmp_path / 'empty'}"]), world_size=1)
    _saved_run(tmp_path / "run")
    with pytest.raises(UserError, match=r"continues that run in its own folder, but hydra.run.dir=.*other"):
        plan_start(_compose([f"trainer.resume={tmp_path / 'run'}", f"hydra.run.dir={tmp_path / 'other'}"]),
                   world_size=2)


def test_a_resume_from_the_folder_takes_its_config_and_the_resumable_keys_of_the_command_line(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    saved = _saved_run(folder)
    plan = plan_start(_compose([f"trainer.resume={folder}", "trainer.epochs=5", "tracker=[tensorboard,csv]",
                                "data.num_workers=1", "norm=bn"]), world_size=2)  # norm=bn: the run's own option
    config = config_dict(plan.config)
    assert plan.checkpoint == folder / "checkpoints" / "last.pt" and plan.run_dir == folder
    assert (plan.resume_point.step, plan.resume_point.evaluated) == (8, True)
    assert config["trainer"]["epochs"] == 5 and config["data"]["num_workers"] == 1
    assert config["tracker"]["csv"] is not None and config["tracker"]["tensorboard"] is not None
    for key in ("seed", "norm", "model", "optim", "sched"):  # the run's, not the command line's defaults
        assert config[key] == saved[key], key
    assert config["data"]["train_size"] == 64 and config["data"]["batch_size"] == 16
    assert plan.overrides[-3:] == ["trainer.epochs=5", "tracker=[tensorboard,csv]", "data.num_workers=1"]


def test_a_resume_refuses_every_change_to_what_is_trained_naming_both_values(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    _saved_run(folder)
    before = _hashes(folder)
    with pytest.raises(UserError) as refused:
        plan_start(_compose([f"trainer.resume={folder}", "model=resnet32", "data.batch_size=8", "seed=4",
                             "trainer.epochs=5"]), world_size=2)
    message = str(refused.value)
    for said in ("model.name: 'resnet20' (the run) -> 'resnet32' (command line)",
                 "data.batch_size: 16 (the run) -> 8 (command line)", "seed: 3 (the run) -> 4 (command line)",
                 f"trainer.resume={folder}/checkpoints/last.pt hydra.run.dir=<a new folder>"):
        assert said in message, message
    assert "trainer.epochs" not in message  # resumable
    assert _hashes(folder) == before


def test_a_resume_keeps_the_global_batch_and_says_which_accumulation_keeps_it(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    _saved_run(folder, world_size=2)
    with pytest.raises(UserError, match=r"2 x 16 x 1 = 32 \(the run\) -> 1 x 16 x 1 = 16 \(this launch\); with 1 "
                                        r"process\(es\), trainer.grad_accum_steps=2 keeps it"):
        plan_start(_compose([f"trainer.resume={folder}"]), world_size=1)
    plan = plan_start(_compose([f"trainer.resume={folder}", "trainer.grad_accum_steps=2"]), world_size=1)
    assert plan.config.trainer.grad_accum_steps == 2
