"""EarlyStopHook: applies trainer.early_stop after each evaluation, the same way on every rank.

Rank 0 compares the metric with the best so far (src/engine/early_stop.py) and broadcasts the new state,
so every rank stops after the same step (the evaluation's metrics are already equal on every rank; the
broadcast makes the decision independent of that). A run resumed after its early stop trains no
further. An early stop is a normal end: the last evaluation and checkpoint are written, exit code 0.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from src import comm
from src.config import EarlyStopConfig
from src.engine.early_stop import EarlyStopState, carried_over, decide
from src.engine.hooks import Hook

if TYPE_CHECKING:
    from src.engine.trainer import Trainer

log = logging.getLogger(__name__)


class EarlyStopHook(Hook):
    """After each evaluation: rank 0 updates the early-stop state and broadcasts it; stop when it says so.

    Runs after EvalHook (it reads trainer.state.metrics) and before CheckpointHook (the checkpoint written
    after this evaluation holds the updated state).
    """

    def __init__(self, settings: EarlyStopConfig, higher_is_better: bool) -> None:
        self.settings = settings
        self.higher_is_better = higher_is_better  # the metric's direction, as the run's task declares it

    def before_train(self, trainer: Trainer) -> None:
        """A resumed run that had already stopped early trains no further (unless patience was raised);
        another metric, or another mode, starts afresh."""
        state, warning = carried_over(self.settings, EarlyStopState.from_dict(trainer.state.early_stop),
                                      self.higher_is_better)
        if warning:
            log.warning(warning)
        if state.stopped and state.bad_evaluations < self.settings.patience:
            log.info("resumed after an early stop, but trainer.early_stop.patience=%d allows more evaluations "
                     "without improvement than the %d so far: training goes on", self.settings.patience,
                     state.bad_evaluations)
            state.stopped, state.reason = False, ""
        trainer.state.early_stop = state.to_dict()
        if state.stopped:
            trainer.request_stop(state.reason)

    def after_epoch(self, trainer: Trainer) -> None:
        """Decide when these weights were just evaluated (trainer.state.metrics is cleared by every step)."""
        metrics = trainer.state.metrics
        if not metrics:
            return
        if self.settings.name not in metrics:
            raise ValueError(f"trainer.early_stop.metric={self.settings.metric!r} is not among this run's "
                             f"validation metrics {sorted(metrics)}")
        state = EarlyStopState.from_dict(trainer.state.early_stop)
        if comm.is_main_process():
            state = decide(self.settings, state, float(metrics[self.settings.name]), trainer.state.progress.step,
                           self.higher_is_better)
        state = EarlyStopState.from_dict(comm.broadcast_object(state.to_dict()))
        trainer.state.early_stop = state.to_dict()
        if state.stopped:
            trainer.request_stop(state.reason)  # logged by the trainer; the run then ends normally (exit 0)
