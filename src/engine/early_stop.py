"""Early stopping's settings (trainer.early_stop.*), its state, and the decision after one evaluation.

The state (best value, evaluations without improvement, whether the run has stopped) lives in
TrainState and so in every checkpoint: a resumed run stops exactly where an uninterrupted one would.
The hook that applies the decision on every rank is src/engine/early_stop_hook.py.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Optional

MODES = ("max", "min", "auto")


@dataclass
class EarlyStopConfig:
    """`trainer.early_stop`: off while `metric` is null."""

    # A validation metric as metrics.jsonl's val rows name it (top1, miou, loss, ema_top1, iou_<class>),
    # optionally written with TensorBoard's prefix: val/top1.
    metric: Optional[str] = None
    mode: str = "auto"  # max | min; auto: min for loss, max for every other metric
    patience: int = 5  # evaluations without improvement before stopping
    min_delta: float = 0.0  # an improvement must beat the best by more than this

    def validate(self, task_metrics: tuple[str, ...], ema: bool, segmentation: bool) -> None:
        """Raise ValueError naming the key when the settings cannot work for this task."""
        if self.mode not in MODES:
            raise ValueError(f"trainer.early_stop.mode must be one of {list(MODES)}, got {self.mode!r}")
        if self.patience < 0:
            raise ValueError(f"trainer.early_stop.patience must be >= 0, got {self.patience}")
        if not self.min_delta >= 0:
            raise ValueError(f"trainer.early_stop.min_delta must be >= 0, got {self.min_delta}")
        if self.metric is None:
            return
        name = self.name
        known = list(task_metrics) + ([f"ema_{m}" for m in task_metrics] if ema else [])
        per_class = segmentation and (name.startswith("iou_") or (ema and name.startswith("ema_iou_")))
        if name not in known and not per_class:
            extra = " or iou_<class name>" if segmentation else ""
            raise ValueError(f"trainer.early_stop.metric={self.metric!r} is not a validation metric of this run; "
                             f"use one of {known}{extra} (a val/ prefix is allowed)")

    @property
    def name(self) -> str:
        """The metric's key in the evaluation's dict (the val/ prefix removed)."""
        return (self.metric or "").removeprefix("val/")

    @property
    def higher_is_better(self) -> bool:
        """mode=max, or auto for anything but a loss."""
        return self.mode == "max" or (self.mode == "auto" and not self.name.endswith("loss"))


@dataclass
class EarlyStopState:
    """What the decision needs to go on after a resume; stored in checkpoints as a plain dict."""

    metric: str = ""
    best: Optional[float] = None
    best_step: int = -1
    bad_evaluations: int = 0  # evaluations since the best one
    stopped: bool = False
    reason: str = ""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EarlyStopState:
        """The state stored in a checkpoint ({} for checkpoints written without early stopping)."""
        fields = cls.__dataclass_fields__
        return cls(**{k: v for k, v in (data or {}).items() if k in fields})

    def to_dict(self) -> dict[str, Any]:
        """Plain values only: checkpoints load with torch.load(weights_only=True)."""
        return asdict(self)


def decide(settings: EarlyStopConfig, state: EarlyStopState, value: float, step: int) -> EarlyStopState:
    """The state after an evaluation that measured `value` at `step` (pure: same inputs, same verdict)."""
    new = EarlyStopState(**state.to_dict())
    sign = 1.0 if settings.higher_is_better else -1.0
    improved = new.best is None or sign * (value - new.best) > settings.min_delta
    if improved:
        new.best, new.best_step, new.bad_evaluations = float(value), step, 0
    else:
        new.bad_evaluations += 1
    if not improved and new.bad_evaluations >= settings.patience:
        new.stopped = True
        new.reason = (f"early stop: val {settings.name} has not improved by more than {settings.min_delta:g} for "
                      f"{new.bad_evaluations} evaluation(s) (trainer.early_stop.patience={settings.patience}); "
                      f"best {new.best:.6g} at step {new.best_step}")
    return new
