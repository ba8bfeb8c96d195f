"""trainer.early_stop: the decision after each evaluation, and its validation before any process starts."""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from src.config import validate_config
from src.config import EarlyStopConfig
from src.engine.early_stop import EarlyStopState, carried_over, decide
from src.tasks import get_task

CLASSIFICATION = get_task("classification")

CONF = Path(__file__).resolve().parents[2] / "conf"


def _run(settings: EarlyStopConfig, values: list[float]) -> list[EarlyStopState]:
    state, states = EarlyStopState(metric=settings.name), []
    for step, value in enumerate(values, start=1):
        state = decide(settings, state, value, step * 10, settings.higher_is_better(CLASSIFICATION))
        states.append(state)
        if state.stopped:
            break
    return states


def test_a_metric_that_cannot_improve_stops_after_patience_plus_one_evaluations() -> None:
    states = _run(EarlyStopConfig(metric="val/top1", patience=2), [40.0] * 10)
    assert len(states) == 3 and states[-1].stopped
    assert (states[-1].best, states[-1].best_step, states[-1].bad_evaluations) == (40.0, 10, 2)
    assert "val top1 has not improved" in states[-1].reason and "patience=2" in states[-1].reason


def test_improvements_reset_the_count_and_min_delta_decides_what_counts() -> None:
    settings = EarlyStopConfig(metric="top1", patience=2, min_delta=0.5)
    states = _run(settings, [10.0, 11.0, 11.4, 11.5, 12.0, 11.0, 13.0])
    # 11.4 and 11.5 do not beat 11.0 by more than 0.5; 12.0 does; 11.0 and 13.0 are judged against 12.0.
    assert [s.bad_evaluations for s in states] == [0, 0, 1, 2]
    assert states[-1].stopped and states[-1].best == 11.0


def test_loss_is_minimised_by_default_and_mode_overrides() -> None:
    assert not EarlyStopConfig(metric="val/loss").higher_is_better(CLASSIFICATION)
    assert EarlyStopConfig(metric="val/loss", mode="max").higher_is_better(CLASSIFICATION)
    assert EarlyStopConfig(metric="top5").higher_is_better(CLASSIFICATION)
    assert not EarlyStopConfig(metric="ema_loss").higher_is_better(CLASSIFICATION)
    states = _run(EarlyStopConfig(metric="loss", patience=1), [3.0, 2.0, 1.0, 1.5])
    assert [s.best for s in states] == [3.0, 2.0, 1.0, 1.0] and states[-1].stopped


def test_patience_zero_stops_at_the_first_evaluation_without_improvement() -> None:
    states = _run(EarlyStopConfig(metric="top1", patience=0), [1.0, 2.0, 2.0])
    assert len(states) == 3 and states[-1].stopped and not states[1].stopped


def test_state_survives_a_checkpoint_round_trip_and_ignores_unknown_keys() -> None:
    state = EarlyStopState(metric="top1", best=3.5, best_step=8, bad_evaluations=1)
    assert EarlyStopState.from_dict({**state.to_dict(), "future_key": 1}) == state
    assert EarlyStopState.from_dict({}) == EarlyStopState()


def test_a_resume_with_another_metric_or_mode_starts_afresh_and_otherwise_carries_on() -> None:
    stored = EarlyStopState(metric="loss", direction="min", best=0.2, best_step=40, bad_evaluations=2)
    same, warning = carried_over(EarlyStopConfig(metric="val/loss", patience=5), stored, False)
    assert warning == "" and same == stored
    flipped, warning = carried_over(EarlyStopConfig(metric="loss", mode="max"), stored, True)
    assert "minimum" in warning and "maximum" in warning and "mode=max" in warning
    assert (flipped.best, flipped.bad_evaluations, flipped.direction) == (None, 0, "max")
    # With the old best (0.2, a minimum) kept, a maximised loss of 0.3 would count as an improvement only
    # by accident; afresh, the first evaluation after the resume sets the best.
    assert decide(EarlyStopConfig(metric="loss", mode="max"), flipped, 0.1, 50, True).best == 0.1
    other, warning = carried_over(EarlyStopConfig(metric="top1"), stored, True)
    assert "follows 'loss'" in warning and other == EarlyStopState(metric="top1", direction="max")
    legacy = EarlyStopState(metric="loss", best=0.2, best_step=40)  # a checkpoint from before `direction`
    kept, warning = carried_over(EarlyStopConfig(metric="loss"), legacy, False)
    assert warning == "" and (kept.best, kept.direction) == (0.2, "min")


def _validate(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return validate_config(compose("train", overrides=list(overrides)))


def test_early_stop_is_off_by_default_and_accepts_the_names_of_metrics_jsonl() -> None:
    assert _validate().trainer.early_stop.metric is None
    for name in ("val/top1", "top5", "val/loss"):
        assert _validate(f"trainer.early_stop.metric={name}").trainer.early_stop.name == name.removeprefix("val/")
    assert _validate("trainer.ema=true", "trainer.early_stop.metric=ema_top1").trainer.early_stop.name == "ema_top1"


@pytest.mark.parametrize("overrides,message", [
    (["trainer.early_stop.metric=val/miou"], "trainer.early_stop.metric='val/miou' is not a validation metric"),
    (["trainer.early_stop.metric=train/loss"], "use one of ['top1', 'top5', 'loss']"),
    (["trainer.early_stop.metric=ema_top1"], "is not a validation metric"),  # trainer.ema is off
    (["trainer.early_stop.metric=top1", "trainer.early_stop.mode=up"], "trainer.early_stop.mode must be one of"),
    (["trainer.early_stop.metric=top1", "trainer.early_stop.patience=-1"], "trainer.early_stop.patience must be"),
    (["trainer.early_stop.metric=top1", "trainer.early_stop.min_delta=-0.1"], "trainer.early_stop.min_delta must"),
])
def test_bad_early_stop_settings_fail_validation_naming_the_key(overrides: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
        _validate(*overrides)
