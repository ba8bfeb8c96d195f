"""MLflow: one run per training run (reopened after a resume), config as params, metrics with their steps.

The store is tracker.mlflow.tracking_uri, else $MLFLOW_TRACKING_URI, else a SQLite database inside the
run dir (<run dir>/mlflow/mlflow.db, artifacts in <run dir>/mlflow/artifacts): a run is complete on its
own and `mlflow ui --backend-store-uri sqlite:///<run dir>/mlflow/mlflow.db` shows it.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Optional

from src.config.tracker import MlflowTrackerConfig
from src.engine.trackers.params import flatten_config
from src.engine.trackers.sink import RunInfo, numeric_metrics

log = logging.getLogger(__name__)

_BATCH = 100  # MlflowClient.log_batch takes at most 100 params (and 1000 metrics) per call
_MAX_PARAM = 6000  # characters MLflow keeps of a param value


def default_tracking_uri(run_dir: Path) -> str:
    """The SQLite store inside the run dir (an absolute path: sqlite:////abs/path/mlflow.db)."""
    return f"sqlite:///{(Path(run_dir).resolve() / 'mlflow' / 'mlflow.db')}"


class MlflowSink:
    """Feeds one MLflow run through MlflowClient (no global mlflow.start_run state)."""

    name = "mlflow"

    def __init__(self, settings: MlflowTrackerConfig) -> None:
        self.settings = settings
        self.client: Any = None
        self.run_id: Optional[str] = None
        self.uri: Optional[str] = None

    def start(self, info: RunInfo, previous: Optional[dict[str, str]]) -> dict[str, str]:
        """Create the run (or reopen `previous`'s when it is in the same store) and log params and tags."""
        from mlflow.tracking import MlflowClient

        self.uri = self.settings.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(
            info.run_dir)
        local = self.uri.startswith("sqlite:") and not (self.settings.tracking_uri or
                                                         os.environ.get("MLFLOW_TRACKING_URI"))
        if local:
            (Path(info.run_dir) / "mlflow").mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(tracking_uri=self.uri)
        logged: dict[str, str] = {}
        if previous and previous.get("tracking_uri") == self.uri and previous.get("run_id"):
            self.run_id = previous["run_id"]
            run = self.client.get_run(self.run_id)  # raises when the run is gone: a loud failure, not a new run
            logged = dict(run.data.params)
            self.client.update_run(self.run_id, status="RUNNING")
            log.info("MLflow: continuing run %s in %s", self.run_id, self.uri)
        else:
            if previous:
                log.warning("MLflow: the checkpoint's run %s was in %s, this run logs to %s: starting a new run",
                            previous.get("run_id"), previous.get("tracking_uri"), self.uri)
            experiment = self.client.get_experiment_by_name(self.settings.experiment)
            if experiment is not None:
                experiment_id = experiment.experiment_id
            else:
                location = (Path(info.run_dir).resolve() / "mlflow" / "artifacts").as_uri() if local else None
                experiment_id = self.client.create_experiment(self.settings.experiment, artifact_location=location)
            run = self.client.create_run(experiment_id, run_name=self.settings.run_name, tags=_tags(info))
            self.run_id = run.info.run_id
            log.info("MLflow: run %s in %s (experiment %r)", self.run_id, self.uri, self.settings.experiment)
        self._log_params(flatten_config(info.config), logged)
        return {"run_id": self.run_id, "tracking_uri": self.uri}

    def log(self, row: dict[str, Any]) -> None:
        """Every numeric metric of the row as `<split>/<name>` at the row's step and wall time."""
        from mlflow.entities import Metric

        timestamp = int(float(row.get("time", 0.0)) * 1000)
        metrics = [Metric(f"{row['split']}/{name}", value, timestamp, int(row["step"]))
                   for name, value in numeric_metrics(row).items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def artifact(self, path: Path) -> None:
        """Upload the best checkpoint under `checkpoints/` when tracker.mlflow.log_best_checkpoint is set."""
        if self.settings.log_best_checkpoint:
            self.client.log_artifact(self.run_id, str(path), artifact_path="checkpoints")
            log.info("MLflow: %s uploaded to run %s", path.name, self.run_id)

    def finish(self, status: str) -> None:
        """Mark the run FINISHED, KILLED or FAILED."""
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, status=status)

    def _log_params(self, params: dict[str, str], logged: dict[str, str]) -> None:
        """Log the params the run does not have; MLflow refuses changed values, so a resume reports those."""
        from mlflow.entities import Param

        changed = sorted(k for k, v in params.items() if k in logged and logged[k] != v[:_MAX_PARAM])
        if changed:
            log.warning("MLflow: run %s keeps its first values of %s (params cannot change; the resumed "
                        "config is in .hydra/ and the checkpoint)", self.run_id, ", ".join(changed))
        new = [Param(k, v[:_MAX_PARAM]) for k, v in params.items() if k not in logged]
        for i in range(0, len(new), _BATCH):
            self.client.log_batch(self.run_id, params=new[i:i + _BATCH])


def _tags(info: RunInfo) -> dict[str, str]:
    tags = {k: v for k, v in info.tags.items() if k != "git_commit"}
    if "git_commit" in info.tags:
        tags["mlflow.source.git.commit"] = info.tags["git_commit"]  # what MLflow's UI shows as the source version
        tags["git_commit"] = info.tags["git_commit"]
    return tags
