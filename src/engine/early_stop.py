"""Early stopping's state and the decision after one evaluation (its settings: src.config.EarlyStopConfig).

The state (best value, evaluations without improvement, whether the run has stopped) lives in
TrainState and so in every checkpoint: a resumed run stops exactly where an uninterrupted one would.
The hook that applies the decision on every rank is src/engine/early_stop_hook.py.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Optional

from src.config import EarlyStopConfig

@dataclass
class EarlyStopState:
    """What the decision needs to go on after a resume; stored in checkpoints as a plain dict."""

    metric: str = ""
    direction: str = ""  # "max" or "min": what `best` was the best of ("" in checkpoints from before it was kept)
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


def decide(settings: EarlyStopConfig, state: EarlyStopState, value: float, step: int,
           higher_is_better: bool) -> EarlyStopState:
    """The state after an evaluation that measured `value` at `step` (pure: same inputs, same verdict);
    `higher_is_better`: the metric's direction (EarlyStopConfig.higher_is_better with the run's task)."""
    new = EarlyStopState(**state.to_dict())
    sign = 1.0 if higher_is_better else -1.0
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


def carried_over(settings: EarlyStopConfig, state: EarlyStopState,
                 higher_is_better: bool) -> tuple[EarlyStopState, str]:
    """A checkpoint's state as this run's settings continue it, and a warning ("" when none is due).

    A state that followed another metric, or the same metric in the other direction (mode changed between
    the runs), cannot go on: its best is the best of something else, so it starts afresh.
    """
    direction = "max" if higher_is_better else "min"
    warning = ""
    if state.metric and state.metric != settings.name:
        warning = (f"the checkpoint's early-stop state follows {state.metric!r}, this run {settings.name!r}: "
                   "starting it afresh")
    elif state.direction and state.direction != direction:
        warning = (f"the checkpoint's early-stop state kept the {state.direction}imum of {state.metric!r}, this run "
                   f"(trainer.early_stop.mode={settings.mode}) looks for the {direction}imum: starting it afresh")
    new = EarlyStopState() if warning else EarlyStopState(**state.to_dict())
    new.metric, new.direction = settings.name, direction
    return new, warning
