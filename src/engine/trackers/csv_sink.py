"""CSV: every metrics row as a line of <run dir>/metrics.csv, for spreadsheets and pandas.

Columns: split, epoch, step, time, then the metric names in the order they first appeared (train
metrics, then val metrics). A row without a metric leaves it blank. When a new metric name shows up
(the first val row, a resumed run with EMA switched on), the file is rewritten once with the wider
header, so the file is always one valid table; a resumed run appends to it, after dropping the rows an interrupted
attempt wrote past the checkpoint it resumes from.
"""
from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any, Callable, Optional

from src.config.tracker import CsvTrackerConfig
from src.engine.trackers.sink import RunInfo, numeric_metrics

FIXED = ["split", "epoch", "step", "time"]


class CsvSink:
    """Appends rows to one CSV file, widening its header when needed."""

    name = "csv"

    def __init__(self, settings: CsvTrackerConfig) -> None:
        self.settings = settings
        self.path: Optional[Path] = None
        self.columns: list[str] = list(FIXED)

    def start(self, info: RunInfo, previous: Optional[dict[str, str]]) -> dict[str, str]:
        """Open <run dir>/<filename>; an existing file (a resumed run) keeps its header and rows."""
        self.path = Path(info.run_dir) / self.settings.filename
        if self.path.exists() and self.path.stat().st_size:
            with open(self.path, newline="", encoding="utf-8") as f:
                self.columns = next(csv.reader(f))
            if info.resume_point is not None:  # rows an interrupted attempt wrote after the checkpoint go
                self._rewrite(self.columns, keep=lambda row: info.resume_point.keeps(row["split"], int(row["step"])))
        return {"path": str(self.path)}

    def log(self, row: dict[str, Any]) -> None:
        """Append the row (rewriting the file first when it brings new metric names)."""
        values = {"split": row["split"], "epoch": row["epoch"], "step": row["step"], "time": row.get("time", ""),
                  **numeric_metrics(row)}
        new = [k for k in values if k not in self.columns]
        if new or not self.path.exists():
            self._rewrite(self.columns + new)
        with open(self.path, "a", newline="", encoding="utf-8") as f:
            csv.DictWriter(f, self.columns, restval="").writerow(values)

    def artifact(self, path: Path) -> None:
        """Nothing: a CSV file keeps no artifacts."""

    def finish(self, status: str) -> None:
        """Nothing to close: every row is written when it arrives."""

    def _rewrite(self, columns: list[str], keep: Callable[[dict[str, str]], bool] = lambda row: True) -> None:
        rows: list[dict[str, str]] = []
        if self.path.exists() and self.path.stat().st_size:
            with open(self.path, newline="", encoding="utf-8") as f:
                rows = [row for row in csv.DictReader(f) if keep(row)]
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, columns, restval="")
            writer.writeheader()
            writer.writerows(rows)
        os.replace(tmp, self.path)
        self.columns = columns
