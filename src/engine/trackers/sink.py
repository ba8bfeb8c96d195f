"""What an experiment tracker (MLflow, W&B, CSV) is to the trainer: a Sink fed rows by one background thread.

Every method runs on the tracker thread of rank 0 (src/engine/trackers/background.py), never on the
training thread, so a sink may block (network, disk) without slowing a step. A method that raises
stops that sink for the rest of the run, with the error logged; the others go on.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Protocol

# How a tracker run ended: MLflow's RunStatus names (W&B gets an exit code from them).
FINISHED, KILLED, FAILED = "FINISHED", "KILLED", "FAILED"


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed run continues: its checkpoint's step, and whether those weights were evaluated.

    What an interrupted attempt logged after that step is not part of the run any more: its rows are dropped from
    metrics.jsonl and the CSV file, its TensorBoard events purged, so every metric has one curve.
    """

    step: int
    evaluated: bool  # the checkpoint holds the evaluation of its weights (their val row stays)

    def keeps(self, split: str, step: int) -> bool:
        """True for a row logged before the checkpoint was written (a val row of its step only if it was evaluated:
        otherwise the resumed run evaluates that step again)."""
        return step < self.step or (step == self.step and (split != "val" or self.evaluated))


@dataclass
class RunInfo:
    """What every tracker is told once, at the start: where the run lives, its config, its tags."""

    run_dir: Path
    config: dict[str, Any]  # the resolved composed config, a plain dict (Hydra's own node left out)
    tags: dict[str, str] = field(default_factory=dict)  # world_size, norm, model, data, git_commit when known
    resumed: bool = False  # the run continues from a checkpoint: reopen the tracker runs it had
    resume_point: Optional[ResumePoint] = None  # a resume's step: rows an interrupted attempt wrote after it go


class Sink(Protocol):
    """One tracker. `row` is a metrics.jsonl row: {split, epoch, step, <metrics>, time, cpu_s}."""

    name: str

    def start(self, info: RunInfo, previous: Optional[dict[str, str]]) -> dict[str, str]:
        """Open (or, with `previous` from a checkpoint, reopen) the tracker run; return what reopens it."""

    def log(self, row: dict[str, Any]) -> None:
        """Record one metrics row."""

    def artifact(self, path: Path) -> None:
        """Keep a file (the best checkpoint) with the run, if this tracker was asked to."""

    def finish(self, status: str) -> None:
        """Close the run as FINISHED, KILLED (preempted) or FAILED."""


def numeric_metrics(row: dict[str, Any]) -> dict[str, float]:
    """The row's metric values that are numbers (bookkeeping fields and non-numeric values left out)."""
    skip = {"split", "epoch", "step", "time", "cpu_s"}
    return {k: float(v) for k, v in row.items()
            if k not in skip and isinstance(v, (int, float)) and not isinstance(v, bool)}
