"""Run outputs on rank 0: metrics.jsonl (one JSON object per line), TensorBoard events, experiment trackers.

Metrics arrive already reduced across ranks (src.comm.reduce_dict in the loop); every other rank
gets a tracker that does nothing, so callers never branch on the rank. metrics.jsonl is written here,
synchronously, whatever `tracker=` says (it is the contract); TensorBoard's SummaryWriter has its own
writer thread. MLflow, W&B and CSV (src/engine/trackers/) get each row through their own bounded
background queue, so a slow tracker never delays a training step.
"""
from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from src.engine.checkpoint.files import atomic_write_bytes
from src.engine.trackers.background import BackgroundSinks
from src.engine.trackers.sink import FINISHED, ResumePoint, RunInfo, Sink

log = logging.getLogger(__name__)


class Tracker:
    """Appends {split, epoch, step, **metrics, time} rows to metrics.jsonl and mirrors scalars to TensorBoard."""

    def __init__(self, run_dir: Path, enabled: bool, tensorboard: bool, sinks: Sequence[Sink] = (),
                 queue_size: int = 10000, finish_timeout_s: float = 300.0, abort_timeout_s: float = 20.0,
                 resume_point: Optional[ResumePoint] = None) -> None:
        """`resume_point`: a resumed run's checkpoint step; metrics.jsonl and TensorBoard continue from it (what an
        interrupted attempt logged after it is dropped)."""
        self.enabled = enabled
        self.path = Path(run_dir) / "metrics.jsonl"
        self.tb_dir = Path(run_dir) / "tensorboard"
        self.writer: Optional[Any] = None
        self.finish_timeout_s, self.abort_timeout_s = finish_timeout_s, abort_timeout_s
        if enabled and resume_point is not None:
            dropped = keep_rows(self.path, resume_point)
            if dropped:
                log.info("metrics.jsonl: %d row(s) an interrupted attempt logged after step %d dropped; the run "
                         "continues from there", dropped, resume_point.step)
        # MLflow / W&B / CSV, each behind its own queue and thread (rank 0 only; none when no such tracker is chosen).
        self.background = BackgroundSinks(sinks, queue_size) if enabled and sinks else None
        if enabled and tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step: TensorBoard hides the events of the earlier attempts from this step on (one curve each).
            purge = resume_point.step + 1 if resume_point is not None else None
            self.writer = SummaryWriter(log_dir=str(self.tb_dir), purge_step=purge)

    def start(self, info: RunInfo, runs: dict[str, dict[str, str]]) -> None:
        """Open the tracker runs (in the background); `runs` holds the previous runs' ids and receives the new."""
        if self.background is not None:
            self.background.start(info, runs)

    def log(self, split: str, epoch: int, step: int, metrics: dict[str, float]) -> None:
        """One metrics.jsonl row, and `split/name` scalars at `step` in TensorBoard."""
        if not self.enabled:
            return
        row = {"split": split, "epoch": epoch, "step": step, **{k: _json_number(v) for k, v in metrics.items()},
               # Wall clock and this process's CPU time: throughput and CPU cost between any two rows.
               "time": round(time.time(), 3), "cpu_s": round(time.process_time(), 3)}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        if self.background is not None:
            self.background.log(row)
        if self.writer is not None:
            for name, value in metrics.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self.writer.add_scalar(f"{split}/{name}", value, step)

    def log_artifact(self, path: Path) -> None:
        """Hand a file (the best checkpoint) to the trackers that keep artifacts."""
        if self.background is not None:
            self.background.artifact(Path(path))

    def flush(self) -> None:
        """Push pending TensorBoard events to disk (the trackers get theirs in close())."""
        if self.writer is not None:
            self.writer.flush()

    def close(self, status: str = FINISHED) -> None:
        """Close the TensorBoard writer; hand every queued row to the trackers and end their runs with `status`.

        FINISHED waits up to tracker.finish_timeout_s for them; KILLED (preemption) and FAILED up to
        tracker.abort_timeout_s, inside the grace time before SIGKILL.
        """
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.background is not None:
            key, timeout_s = (("tracker.finish_timeout_s", self.finish_timeout_s) if status == FINISHED
                              else ("tracker.abort_timeout_s", self.abort_timeout_s))
            self.background.close(status, timeout_s, key)
            self.background = None


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """All rows of a run's metrics.jsonl (for tests, scripts and resume checks)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def keep_rows(path: Path, point: ResumePoint) -> int:
    """Rewrite the metrics.jsonl at `path` (atomically) without the rows a resume from `point` replaces; returns
    how many were dropped."""
    if not path.is_file():
        return 0
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line cut short when the attempt died
        if point.keeps(str(row.get("split")), int(row.get("step", 0))):
            kept.append(line if line.endswith("\n") else line + "\n")
    if len(kept) != len(lines):
        atomic_write_bytes("".join(kept).encode("utf-8"), path)
    return len(lines) - len(kept)


def _json_number(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep the row parseable
    return value
