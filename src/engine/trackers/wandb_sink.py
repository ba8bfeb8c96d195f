"""Weights & Biases: one run per training run (same id after a resume), offline unless credentials exist.

Files go to <run dir>/wandb/ (offline-run-<time>-<id>/run-<id>.wandb holds the history); `wandb sync`
uploads an offline run later. Each metrics row is one history row with its `step` and `epoch`, and
every metric is plotted against `step` (define_metric), so train and val rows of one step coexist and a
resumed run's rows line up with the first part's.
"""
from __future__ import annotations

import logging
import netrc
import os
import uuid
from typing import Any, Optional
from urllib.parse import urlparse

from src.config.tracker import WandbTrackerConfig
from src.engine.trackers.sink import FINISHED, RunInfo, numeric_metrics

log = logging.getLogger(__name__)


def has_credentials() -> bool:
    """True when WANDB_API_KEY is set or `wandb login` stored a key in ~/.netrc for the W&B host."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def resolve_mode(mode: str) -> Optional[str]:
    """The mode for wandb.init: None leaves WANDB_MODE from the environment in charge."""
    if os.environ.get("WANDB_MODE"):
        return None
    if mode == "auto":
        return "online" if has_credentials() else "offline"
    return mode


class WandbSink:
    """Feeds one wandb run object (wandb.init in the tracker thread; nothing global is left behind)."""

    name = "wandb"

    def __init__(self, settings: WandbTrackerConfig) -> None:
        self.settings = settings
        self.run: Any = None

    def start(self, info: RunInfo, previous: Optional[dict[str, str]]) -> dict[str, str]:
        """wandb.init with the checkpoint's run id when resuming (resume="allow"), files under the run dir."""
        import wandb

        run_id = (previous or {}).get("run_id") or uuid.uuid4().hex[:12]
        mode = resolve_mode(self.settings.mode)
        self.run = wandb.init(
            project=self.settings.project, entity=self.settings.entity, name=self.settings.name,
            tags=[*self.settings.tags, *(f"{k}={v}" for k, v in info.tags.items())], id=run_id, resume="allow",
            dir=str(info.run_dir), config=info.config, mode=mode,
            # console="off": W&B must not rewrap stdout/stderr (the trainer's logging owns them);
            # no system-metrics sampler: it would compete with training for CPU.
            settings=wandb.Settings(console="off", x_disable_stats=True),
        )
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")
        log.info("W&B: run %s (%s), files in %s", self.run.id, mode or os.environ.get("WANDB_MODE"), self.run.dir)
        return {"run_id": self.run.id}

    def log(self, row: dict[str, Any]) -> None:
        """One history row: `<split>/<name>` metrics with the row's step and epoch."""
        values = {f"{row['split']}/{k}": v for k, v in numeric_metrics(row).items()}
        self.run.log({**values, "step": int(row["step"]), "epoch": int(row["epoch"])})

    def artifact(self, path: Any) -> None:
        """Checkpoints are not uploaded to W&B (MLflow's log_best_checkpoint does that)."""

    def finish(self, status: str) -> None:
        """Close the run; a preempted or failed run exits non-zero in W&B's records."""
        if self.run is not None:
            self.run.finish(exit_code=0 if status == FINISHED else 1)
            self.run = None
