"""Run outputs on rank 0: metrics.jsonl (one JSON object per line) and TensorBoard events.

Metrics arrive already reduced across ranks (src.dist.reduce_dict in the loop); every other rank
gets a tracker that does nothing, so callers never branch on the rank.
"""
from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any, Optional

log = logging.getLogger(__name__)


class Tracker:
    """Appends {split, epoch, step, **metrics, time} rows to metrics.jsonl and mirrors scalars to TensorBoard."""

    def __init__(self, run_dir: Path, enabled: bool, tensorboard: bool) -> None:
        self.enabled = enabled
        self.path = Path(run_dir) / "metrics.jsonl"
        self.tb_dir = Path(run_dir) / "tensorboard"
        self.writer: Optional[Any] = None
        if enabled and tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(self.tb_dir))

    def log(self, split: str, epoch: int, step: int, metrics: dict[str, float]) -> None:
        """One metrics.jsonl row, and `split/name` scalars at `step` in TensorBoard."""
        if not self.enabled:
            return
        row = {"split": split, "epoch": epoch, "step": step, **{k: _json_number(v) for k, v in metrics.items()},
               # Wall clock and this process's CPU time: throughput and CPU cost between any two rows.
               "time": round(time.time(), 3), "cpu_s": round(time.process_time(), 3)}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        if self.writer is not None:
            for name, value in metrics.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self.writer.add_scalar(f"{split}/{name}", value, step)

    def flush(self) -> None:
        """Push pending TensorBoard events to disk."""
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        """Flush and close the TensorBoard writer."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """All rows of a run's metrics.jsonl (for tests, scripts and resume checks)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _json_number(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep the row parseable
    return value
