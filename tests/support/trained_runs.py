"""Trained runs that several tests read: torchrun jobs made once per test session (also under pytest-xdist) and
shared read-only (`shared_run`; a task's own run is a fixture in its tests' conftest.py). A test that must change
a run copies it first (`copy_run`); the fixtures fail at the end of the session if a shared run was changed.

Each run is as small as its readers allow. The classification run: 2 processes with per-rank BN (norm=bn) and
an EMA of decay 0.5 (so the EMA weights differ from the model's), 64 training images in batches of 16 per process
(2 optimizer steps), one epoch, one evaluation on 37 images (a prime: no world size divides it) in batches of 8
(several batches per rank).
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.launch import launch
from tests.support.shared_dir import assert_unchanged, fingerprint, made_once

QUIET = ["trainer.progress_bar=false", "trainer.tensorboard=false", "trainer.num_threads=1"]
CLS_OVERRIDES = [
    "model=resnet20", "norm=bn", "data=shapes", "data.train_size=64", "data.val_size=37", "data.batch_size=16",
    "data.eval_batch_size=8", "trainer.epochs=1", "trainer.ema=true", "trainer.ema_decay=0.5",
]
CLS_VAL_SIZE = 37


def _train(overrides: list[str]):
    """A `make` for made_once: train.py on 2 processes into the folder given."""
    def make(run_dir: Path) -> None:
        result = launch(2, [*overrides, *QUIET, f"hydra.run.dir={run_dir}"])
        assert result.returncode == 0, f"the shared run {run_dir.name} failed:\n{result.stdout[-5000:]}"
    return make


def shared_run(factory: pytest.TempPathFactory, name: str, overrides: list[str]) -> Iterator[Path]:
    """A session fixture's body: the 2-process training run `name` with `overrides`, made once, checked unchanged."""
    run_dir = made_once(factory, name, _train(overrides))
    before = fingerprint(run_dir)
    yield run_dir
    assert_unchanged(run_dir, before)


@pytest.fixture(scope="session")
def trained_cls_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The classification run's folder (CLS_OVERRIDES): metrics.jsonl, checkpoints/last.pt with EMA weights."""
    yield from shared_run(tmp_path_factory, "cls_run", CLS_OVERRIDES)




def copy_run(run_dir: Path, dest: Path) -> Path:
    """A copy of a shared run that a test may change (resume, rewrite a checkpoint)."""
    return Path(shutil.copytree(run_dir, dest, symlinks=True))
