"""tracker=[tensorboard,mlflow,wandb,csv] end to end: a 2-process torchrun job, then a resume, read back with
the trackers' own readers (MlflowClient, W&B's protobuf records, the csv module) against metrics.jsonl."""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from src.engine.checkpoint.files import load_checkpoint
from tests.engine.wandb_history import history
from tests.support.launch import REPO, TINY, launch, rows

# 64 images / (2 x 8) = 4 optimizer steps per epoch, a train row every step, a val row every epoch.
JOB = [*TINY, "data.train_size=64", "data.val_size=31", "data.batch_size=8", "norm=bn", "trainer.log_every=1",
       "tracker=[tensorboard,mlflow,wandb,csv]", "tracker.mlflow.log_best_checkpoint=true"]


@pytest.fixture
def tracker_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No tracker settings from the caller's environment: the defaults (store in the run dir, W&B offline)."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR",
                 "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))  # no `wandb login` credentials either
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))


def _leaves(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _jsonl_series(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """{"train/loss": [(step, value), ...], "val/top1": ...} from metrics.jsonl's numeric metrics."""
    series: dict[str, list[tuple[int, float]]] = {}
    for split in ("train", "val"):
        for row in rows(run_dir, split):
            for key, value in row.items():
                if key not in {"split", "epoch", "step", "time", "cpu_s"} and isinstance(value, (int, float)):
                    series.setdefault(f"{split}/{key}", []).append((row["step"], float(value)))
    return series


def _check_mlflow(run_dir: Path) -> str:
    """The run dir's MLflow store holds one finished run whose params, tags and metrics match the job."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("synctrain")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1, [r.info.run_id for r in runs]
    run = runs[0]
    assert run.info.status == "FINISHED"
    config = load_checkpoint(run_dir / "checkpoints" / "last.pt")["config"]
    leaves = _leaves(config)
    params = run.data.params
    assert set(params) == set(leaves)
    assert params["model.name"] == "resnet20" and params["norm.name"] == "bn" and params["data.batch_size"] == "8"
    assert params["trainer.log_every"] == "1"
    tags = run.data.tags
    assert tags["world_size"] == "2" and tags["norm"] == "bn"
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert tags["mlflow.source.git.commit"] == commit.strip()
    expected = _jsonl_series(run_dir)
    assert {"train/loss", "train/lr", "val/top1", "val/top5", "val/loss"} <= expected.keys()
    for name, series in expected.items():
        got = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, name))
        assert got == sorted(series), name
    return run.info.run_id


def _check_wandb(run_dir: Path, run_id: str, parts: int) -> None:
    """W&B's offline files under the run dir hold every metrics.jsonl row (one offline run dir per launch)."""
    assert len(list((run_dir / "wandb").glob(f"offline-run-*-{run_id}"))) == parts
    got = sorted((r["step"], k, v) for r in history(run_dir)[run_id] for k, v in r.items() if "/" in k)
    want = sorted((s, k, v) for k, series in _jsonl_series(run_dir).items() for s, v in series)
    assert got == want


def _check_csv(run_dir: Path) -> None:
    """metrics.csv has the rows of metrics.jsonl, in order, with the same values."""
    with open(run_dir / "metrics.csv", newline="") as f:
        table = list(csv.DictReader(f))
    jsonl = rows(run_dir, "train") + rows(run_dir, "val")
    assert len(table) == len(jsonl)
    assert sorted((r["split"], int(r["step"]), float(r["loss"])) for r in table) == \
        sorted((r["split"], r["step"], r["loss"]) for r in jsonl)


@pytest.mark.slow
def test_two_process_run_feeds_mlflow_wandb_csv_and_a_resume_continues_the_same_runs(
        tmp_path: Path, tracker_env: None) -> None:
    run_dir = tmp_path / "run"
    first = launch(2, [*JOB, "trainer.epochs=2", f"hydra.run.dir={run_dir}"])
    assert first.returncode == 0, first.stdout[-4000:]
    assert "failed" not in first.stdout, first.stdout[-4000:]  # no tracker reported an error
    assert [r["step"] for r in rows(run_dir, "val")] == [4, 8]
    run_id = _check_mlflow(run_dir)
    wandb_id = json.loads((run_dir / "trackers.json").read_text())["wandb"]["run_id"]
    _check_wandb(run_dir, wandb_id, parts=1)
    _check_csv(run_dir)
    assert (run_dir / "tensorboard").is_dir()

    second = launch(2, [*JOB, "trainer.epochs=3", "trainer.resume=auto", f"hydra.run.dir={run_dir}"])
    assert second.returncode == 0, second.stdout[-4000:]
    assert "resumed from" in second.stdout
    assert [r["step"] for r in rows(run_dir, "val")] == [4, 8, 12]
    assert _check_mlflow(run_dir) == run_id  # the same MLflow run, now with the third epoch's rows
    best = load_checkpoint(run_dir / "checkpoints" / "last.pt")["best"][0][1]
    uploaded = (run_dir / "mlflow" / "artifacts").glob(f"*/artifacts/checkpoints/{best}")
    assert [p.read_bytes() for p in uploaded] == [(run_dir / "checkpoints" / best).read_bytes()]
    trackers = load_checkpoint(run_dir / "checkpoints" / "last.pt")["trackers"]
    assert trackers["mlflow"]["run_id"] == run_id and trackers["wandb"]["run_id"] == wandb_id
    _check_wandb(run_dir, wandb_id, parts=2)
    _check_csv(run_dir)


@pytest.mark.slow
def test_a_preempted_run_hands_every_row_to_mlflow_and_closes_its_run_as_killed(
        tmp_path: Path, tracker_env: None) -> None:
    from mlflow.tracking import MlflowClient

    from tests.cluster.torchrun_harness import job_env, launch_torchrun, wait_until

    run_dir = tmp_path / "run"
    overrides = [*JOB, "tracker=[mlflow,csv]", "trainer.epochs=200", f"hydra.run.dir={run_dir}"]
    job = launch_torchrun(["--standalone", "--nproc_per_node=2"], overrides, tmp_path / "job.log", job_env())
    try:
        # The MLflow run is open and training goes on; then a scheduler's SIGTERM reaches torchrun.
        wait_until(lambda: "mlflow" in ((run_dir / "trackers.json").is_file() and
                                        json.loads((run_dir / "trackers.json").read_text()) or {}),
                   600, "the MLflow run to open", job, poll=0.2)
        wait_until(lambda: len(rows(run_dir, "train")) >= 2, 300, "two train rows", job, poll=0.1)
        os.kill(job.pid, signal.SIGTERM)
        assert job.wait(timeout=300) != 0
    finally:
        job.kill()
    for rank in (0, 1):
        assert "stopped on SIGTERM" in (run_dir / "logs" / f"rank{rank}.log").read_text()
    run_id = json.loads((run_dir / "trackers.json").read_text())["mlflow"]["run_id"]
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow' / 'mlflow.db'}")
    assert client.get_run(run_id).info.status == "KILLED"
    for name, series in _jsonl_series(run_dir).items():  # every row up to the stop, none lost in the queue
        assert sorted((m.step, m.value) for m in client.get_metric_history(run_id, name)) == sorted(series), name
    _check_csv(run_dir)
