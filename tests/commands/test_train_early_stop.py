"""trainer.early_stop end to end: 2-process torchrun jobs whose validation metric cannot improve.

optim.lr=1e-12 with norm=gn (no running statistics): every update is far below float32's resolution of the
weights, so the weights, and with them val/top1, stay exactly what they were after initialisation.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from src.engine.checkpoint.files import load_checkpoint
from tests.support.launch import TINY, launch, rows

# 64 images / (2 x 8) = 4 optimizer steps per epoch; an evaluation after every epoch.
JOB = [*TINY, "data.train_size=64", "data.val_size=31", "data.batch_size=8", "norm=gn", "optim.lr=1e-12",
       "trainer.log_every=1", "trainer.tensorboard=false",
       "trainer.early_stop.metric=val/top1", "trainer.early_stop.patience=2"]
REASON = "early stop: val top1 has not improved by more than 0 for 2 evaluation(s)"


@pytest.mark.slow
def test_a_metric_that_cannot_improve_ends_the_run_after_patience_plus_one_evaluations(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = launch(2, [*JOB, "trainer.epochs=10", f"hydra.run.dir={run_dir}"])
    assert result.returncode == 0, result.stdout[-4000:]
    assert REASON in result.stdout
    val = rows(run_dir, "val")
    assert [r["step"] for r in val] == [4, 8, 12]  # patience 2: the first evaluation sets the best, two more fail
    assert len({r["top1"] for r in val}) == 1  # the metric really was constant
    assert rows(run_dir, "train")[-1]["step"] == 12  # no rank trained past the decision
    last = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert last["step"] == 12
    state = last["early_stop"]
    assert (state["stopped"], state["bad_evaluations"], state["best_step"], state["metric"]) == (True, 2, 4, "top1")


@pytest.mark.slow
def test_a_resumed_run_stops_where_an_uninterrupted_one_would_and_stays_stopped(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = launch(2, [*JOB, "trainer.epochs=2", f"hydra.run.dir={run_dir}"])
    assert first.returncode == 0, first.stdout[-4000:]
    assert "early stop" not in first.stdout  # two evaluations: one without improvement so far
    assert load_checkpoint(run_dir / "checkpoints" / "last.pt")["early_stop"]["bad_evaluations"] == 1

    # Without the checkpointed state the count would restart and this run would evaluate 3 more times.
    second = launch(2, [*JOB, "trainer.epochs=10", "trainer.resume=auto", f"hydra.run.dir={run_dir}"])
    assert second.returncode == 0, second.stdout[-4000:]
    assert "resumed from" in second.stdout and REASON in second.stdout
    assert [r["step"] for r in rows(run_dir, "val")] == [4, 8, 12]

    # Resuming a run that has stopped early trains nothing more and still ends normally.
    third = launch(2, [*JOB, "trainer.epochs=10", "trainer.resume=auto", f"hydra.run.dir={run_dir}"])
    assert third.returncode == 0, third.stdout[-4000:]
    assert REASON in third.stdout
    assert [r["step"] for r in rows(run_dir, "val")] == [4, 8, 12]
    assert rows(run_dir, "train")[-1]["step"] == 12

    # A resume that raises the patience goes on until the new patience is used up (one more evaluation).
    fourth = launch(2, [*JOB, "trainer.epochs=10", "trainer.resume=auto", "trainer.early_stop.patience=3",
                        f"hydra.run.dir={run_dir}"])
    assert fourth.returncode == 0, fourth.stdout[-4000:]
    assert "for 3 evaluation(s) (trainer.early_stop.patience=3)" in fourth.stdout
    assert [r["step"] for r in rows(run_dir, "val")] == [4, 8, 12, 16]
