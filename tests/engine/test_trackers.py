"""The tracker queue and the trackers themselves, without training: a slow tracker never delays the caller,
a failing one is reported as an error, a full queue drops rows loudly; real MLflow and CSV sinks."""
from __future__ import annotations

import csv
import logging
import threading
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from src.engine.trackers.background import BackgroundSinks
from src.config.tracker import CsvTrackerConfig, MlflowTrackerConfig
from src.engine.trackers.csv_sink import CsvSink
from src.engine.trackers.mlflow_sink import MlflowSink
from src.engine.trackers.params import flatten_config
from src.engine.trackers.records import read_records
from src.engine.trackers.sink import KILLED, ResumePoint, RunInfo
from src.engine.tracking import Tracker, read_metrics


class GatedSink:
    """A tracker that takes rows only once `gate` opens: a server that is down or very slow."""

    name = "gated"

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.rows: list[dict[str, Any]] = []
        self.status: Optional[str] = None

    def start(self, info: RunInfo, previous: Optional[dict[str, str]]) -> dict[str, str]:
        self.gate.wait(30)
        return {"run_id": "gated-1"}

    def log(self, row: dict[str, Any]) -> None:
        self.gate.wait(30)
        self.rows.append(row)

    def artifact(self, path: Path) -> None:
        pass

    def finish(self, status: str) -> None:
        self.status = status


class BrokenSink(GatedSink):
    """A tracker whose every row fails (e.g. a server that refuses the run)."""

    name = "broken"

    def log(self, row: dict[str, Any]) -> None:
        raise ConnectionError("server said no")


def _row(step: int) -> dict[str, Any]:
    return {"split": "train", "epoch": 0, "step": step, "loss": 1.0 / step, "time": 1.0, "cpu_s": 0.1}


def test_a_stalled_tracker_never_delays_the_training_thread(tmp_path: Path) -> None:
    sink = GatedSink()
    tracker = Tracker(tmp_path, enabled=True, tensorboard=False, sinks=[sink], queue_size=100)
    runs: dict[str, dict[str, str]] = {}
    tracker.start(RunInfo(tmp_path, {"a": 1}), runs)
    started = time.perf_counter()
    for step in range(1, 51):
        tracker.log("train", 0, step, {"loss": 1.0 / step})
    assert time.perf_counter() - started < 1.0  # the sink is stuck in start(): nothing waited for it
    assert len(read_metrics(tmp_path)) == 50  # metrics.jsonl is written right away, whatever the trackers do
    assert sink.rows == [] and runs == {}
    sink.gate.set()
    assert tracker.background.flush(30)
    assert [r["step"] for r in sink.rows] == list(range(1, 51))
    assert runs == {"gated": {"run_id": "gated-1"}}
    assert read_records(tmp_path) == runs  # trackers.json: what a resume reopens
    tracker.close(KILLED)
    assert sink.status == KILLED


def test_a_full_queue_drops_rows_for_the_trackers_and_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sink = GatedSink()
    queue = BackgroundSinks([sink], queue_size=5)
    with caplog.at_level(logging.WARNING):
        for step in range(1, 21):
            queue.log(_row(step))
    assert queue.dropped >= 14  # 5 queued, at most one taken by the thread before it blocked
    assert "row(s) dropped" in caplog.text
    sink.gate.set()
    with caplog.at_level(logging.ERROR):
        queue.close(timeout_s=10)
    assert f"{queue.dropped} metric row(s) were not sent" in caplog.text
    assert len(sink.rows) == 20 - queue.dropped


def test_a_failing_tracker_is_reported_and_the_others_go_on(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    good, bad = GatedSink(), BrokenSink()
    good.gate.set()
    bad.gate.set()
    queue = BackgroundSinks([bad, good], queue_size=100)
    with caplog.at_level(logging.ERROR):
        for step in (1, 2, 3):
            queue.log(_row(step))
        assert queue.flush(10)
        queue.close(timeout_s=10)
    assert [r["step"] for r in good.rows] == [1, 2, 3]
    assert queue.failed == {"broken": "ConnectionError: server said no"}
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert any("tracker broken failed in log()" in r.getMessage() and r.exc_info for r in errors)
    assert any("tracker broken failed during this run" in r.getMessage() for r in errors)
    assert bad.status is None and good.status == "FINISHED"  # a failed tracker receives nothing more


def test_close_gives_up_on_a_hung_tracker_within_its_timeout(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sink = GatedSink()
    queue = BackgroundSinks([sink], queue_size=10)
    queue.log(_row(1))
    started = time.perf_counter()
    with caplog.at_level(logging.ERROR):
        queue.close(KILLED, timeout_s=1.0, setting="tracker.abort_timeout_s")
    assert time.perf_counter() - started < 5
    assert "tracker gated did not finish within tracker.abort_timeout_s=1s" in caplog.text
    sink.gate.set()


def test_a_stalled_tracker_does_not_hold_back_the_others(tmp_path: Path) -> None:
    stalled, healthy = GatedSink(), GatedSink()
    healthy.name = "healthy"
    healthy.gate.set()
    queue = BackgroundSinks([stalled, healthy], queue_size=100)
    for step in (1, 2):
        queue.log(_row(step))
    deadline = time.monotonic() + 30
    while len(healthy.rows) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [r["step"] for r in healthy.rows] == [1, 2] and stalled.rows == []
    stalled.gate.set()
    queue.close(timeout_s=30)
    assert [r["step"] for r in stalled.rows] == [1, 2]


@pytest.mark.usefixtures("restores_rng")  # MLflow names a new run with draws from Python's global generator
def test_mlflow_sink_writes_a_real_store_and_reopens_its_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    info = RunInfo(tmp_path, {"model": {"name": "resnet20"}, "optim": {"betas": [0.9, 0.999]}, "x": None},
                   {"world_size": "2", "norm": "syncbn", "git_commit": "a" * 40})
    sink = MlflowSink(MlflowTrackerConfig(experiment="exp"))
    record = sink.start(info, None)
    sink.log({"split": "val", "epoch": 0, "step": 7, "top1": 12.5, "loss": 2, "time": 100.0, "cpu_s": 1.0})
    sink.finish("FINISHED")
    assert record["tracking_uri"] == f"sqlite:///{tmp_path.resolve() / 'mlflow' / 'mlflow.db'}"

    again = MlflowSink(MlflowTrackerConfig(experiment="exp"))
    assert again.start(RunInfo(tmp_path, {**info.config, "seed": 4}, info.tags), record) == record
    again.log({"split": "val", "epoch": 1, "step": 14, "top1": 25.0, "time": 200.0})
    best = tmp_path / "best_step0000014_top125.0000.pt"
    best.write_bytes(b"weights")
    again.artifact(best)  # log_best_checkpoint is off: nothing uploaded
    again.settings.log_best_checkpoint = True
    again.artifact(best)
    again.finish("KILLED")

    client = MlflowClient(tracking_uri=record["tracking_uri"])
    run = client.get_run(record["run_id"])
    assert run.info.status == "KILLED"
    assert run.data.params == {"model.name": "resnet20", "optim.betas": "[0.9, 0.999]", "x": "null", "seed": "4"}
    assert run.data.tags["mlflow.source.git.commit"] == "a" * 40 and run.data.tags["world_size"] == "2"
    history = client.get_metric_history(record["run_id"], "val/top1")
    assert sorted((m.step, m.value, m.timestamp) for m in history) == [(7, 12.5, 100000), (14, 25.0, 200000)]
    assert [a.path for a in client.list_artifacts(record["run_id"], "checkpoints")] == [f"checkpoints/{best.name}"]
    copy = client.download_artifacts(record["run_id"], f"checkpoints/{best.name}", str(tmp_path / "download"))
    assert Path(copy).read_bytes() == b"weights"


def test_an_unreachable_mlflow_store_fails_loudly_and_training_rows_still_land(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchscheme://tracker")
    tracker = Tracker(tmp_path, enabled=True, tensorboard=False,
                      sinks=[MlflowSink(MlflowTrackerConfig())], finish_timeout_s=30)
    tracker.start(RunInfo(tmp_path, {}), {})
    tracker.log("train", 0, 1, {"loss": 1.0})
    with caplog.at_level(logging.ERROR):
        tracker.close()
    assert "tracker mlflow failed in start()" in caplog.text
    assert len(read_metrics(tmp_path)) == 1


def test_csv_sink_widens_its_header_and_a_resume_appends(tmp_path: Path) -> None:
    info = RunInfo(tmp_path, {})
    sink = CsvSink(CsvTrackerConfig())
    sink.start(info, None)
    sink.log({"split": "train", "epoch": 0, "step": 1, "loss": 0.5, "lr": 0.1, "time": 1.0, "cpu_s": 0.0})
    sink.log({"split": "val", "epoch": 0, "step": 1, "loss": 0.25, "top1": 50.0, "time": 2.0})
    resumed = CsvSink(CsvTrackerConfig())
    resumed.start(info, {"path": str(tmp_path / "metrics.csv")})
    resumed.log({"split": "train", "epoch": 1, "step": 2, "loss": 0.125, "lr": 0.05, "time": 3.0})
    with open(tmp_path / "metrics.csv", newline="") as f:
        table = list(csv.reader(f))
    assert table == [["split", "epoch", "step", "time", "loss", "lr", "top1"],
                     ["train", "0", "1", "1.0", "0.5", "0.1", ""],
                     ["val", "0", "1", "2.0", "0.25", "", "50.0"],
                     ["train", "1", "2", "3.0", "0.125", "0.05", ""]]


def test_flatten_config_joins_nested_keys_with_dots() -> None:
    assert flatten_config({"a": {"b": {"c": 1}, "d": []}, "e": None, "f": {}}) == {
        "a.b.c": "1", "a.d": "[]", "e": "null", "f": "{}"}


def test_a_resume_drops_what_an_interrupted_attempt_logged_after_its_checkpoint(tmp_path: Path) -> None:
    """metrics.jsonl, the CSV file and TensorBoard continue from the checkpoint's step: one value per step and
    metric. The attempt logged steps 1-6 and val at 4 and 6, then died; its last.pt is step 4 (evaluated)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    first = Tracker(tmp_path, enabled=True, tensorboard=True, sinks=[CsvSink(CsvTrackerConfig())])
    first.start(RunInfo(tmp_path, {}), {})
    for step in range(1, 7):
        first.log("train", 0, step, {"loss": float(step)})
        if step in (4, 6):
            first.log("val", 0, step, {"top1": float(step)})
    first.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"split": "train", "ep')  # a row cut short by the kill

    point = ResumePoint(step=4, evaluated=True)
    again = Tracker(tmp_path, enabled=True, tensorboard=True, sinks=[CsvSink(CsvTrackerConfig())], resume_point=point)
    again.start(RunInfo(tmp_path, {}, resumed=True, resume_point=point), {})
    for step in (5, 6):
        again.log("train", 0, step, {"loss": 10.0 * step})
    again.log("val", 0, 6, {"top1": 60.0})
    again.close()

    expected = {"train": [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 50.0), (6, 60.0)], "val": [(4, 4.0), (6, 60.0)]}
    jsonl = read_metrics(tmp_path)
    assert {s: [(r["step"], r.get("loss", r.get("top1"))) for r in jsonl if r["split"] == s] for s in expected} \
        == expected
    with open(tmp_path / "metrics.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [(r["split"], int(r["step"])) for r in table] == [(r["split"], r["step"]) for r in jsonl]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == expected["train"]
    assert [(e.step, e.value) for e in events.Scalars("val/top1")] == expected["val"]
    # A checkpoint written before its step's evaluation (a step checkpoint at an epoch's end): that val row goes too,
    # since the resumed run evaluates the step again.
    assert not ResumePoint(4, evaluated=False).keeps("val", 4) and ResumePoint(4, evaluated=False).keeps("train", 4)
