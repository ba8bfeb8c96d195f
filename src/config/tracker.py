"""`tracker` config group schema: which experiment trackers a run feeds, and their settings.

Each option of conf/tracker/ fills one key of TrackerConfig; a key left null is a tracker that is off.
`tracker=[tensorboard,mlflow]` selects several options, so several keys are filled. metrics.jsonl is
not a tracker here: every run writes it (it is the contract tests and scripts read).
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import List, Optional

WANDB_MODES = ("auto", "offline", "online")
# The package each tracker needs (requirements.txt installs them), checked before any process starts.
PACKAGES = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}


@dataclass
class TensorBoardTrackerConfig:
    """TensorBoard events under <run dir>/tensorboard/ (also switched off by trainer.tensorboard=false)."""


@dataclass
class MlflowTrackerConfig:
    """An MLflow run: the composed config as params, every metric row with its step, tags."""

    experiment: str = "synctrain"
    run_name: Optional[str] = None  # null: MLflow picks one
    # null: $MLFLOW_TRACKING_URI when set, else a SQLite store in <run dir>/mlflow/ (artifacts beside it).
    tracking_uri: Optional[str] = None
    log_best_checkpoint: bool = False  # upload the best-k best checkpoint as an artifact when training ends


@dataclass
class WandbTrackerConfig:
    """A Weights & Biases run with its files under <run dir>/wandb/."""

    project: str = "synctrain"
    entity: Optional[str] = None
    name: Optional[str] = None
    tags: List[str] = field(default_factory=list)
    # auto: online when credentials are configured (WANDB_API_KEY or `wandb login`), else offline;
    # WANDB_MODE in the environment wins over this key.
    mode: str = "auto"


@dataclass
class CsvTrackerConfig:
    """Every metric row as a line of <run dir>/<filename> (one column per metric, blank where absent)."""

    filename: str = "metrics.csv"


@dataclass
class TrackerConfig:
    """The trackers fed from rank 0, each behind a bounded background queue (src/engine/trackers/background.py)."""

    tensorboard: Optional[TensorBoardTrackerConfig] = None
    mlflow: Optional[MlflowTrackerConfig] = None
    wandb: Optional[WandbTrackerConfig] = None
    csv: Optional[CsvTrackerConfig] = None
    # Rows waiting for a slow tracker; when full, new rows are dropped for it (with a warning), never waited on.
    queue_size: int = 10000
    # How long the end of a run waits for trackers to take pending rows and close their runs: after training
    # (nothing else waits then), and after a preemption or an error (short enough to fit in the grace time
    # a preemption leaves: torchrun and SLURM send SIGKILL about 30 s after SIGTERM).
    finish_timeout_s: float = 300.0
    abort_timeout_s: float = 20.0

    def validate(self) -> None:
        """Raise ValueError naming the first bad key."""
        if self.queue_size < 1:
            raise ValueError(f"tracker.queue_size must be >= 1, got {self.queue_size}")
        for key in ("finish_timeout_s", "abort_timeout_s"):
            if not getattr(self, key) > 0:
                raise ValueError(f"tracker.{key} must be > 0, got {getattr(self, key)}")
        for name in self.enabled():
            package = PACKAGES.get(name)
            if package is not None and importlib.util.find_spec(package) is None:
                raise ValueError(f"tracker={name} needs the {package!r} package, which is not installed: "
                                 f"pip install -r requirements.txt (or drop {name} from tracker=)")
        if self.mlflow is not None and not self.mlflow.experiment:
            raise ValueError("tracker.mlflow.experiment must be a non-empty name")
        if self.wandb is not None and self.wandb.mode not in WANDB_MODES:
            raise ValueError(f"tracker.wandb.mode must be one of {list(WANDB_MODES)}, got {self.wandb.mode!r}")
        if self.csv is not None and (not self.csv.filename or "/" in self.csv.filename):
            raise ValueError(f"tracker.csv.filename must be a file name inside the run dir, got {self.csv.filename!r}")
        if self.csv is not None and self.csv.filename == "metrics.jsonl":
            raise ValueError("tracker.csv.filename=metrics.jsonl would overwrite the run's metrics.jsonl")

    def enabled(self) -> list[str]:
        """Names of the trackers switched on, in a fixed order."""
        return [name for name in ("tensorboard", "mlflow", "wandb", "csv") if getattr(self, name) is not None]
