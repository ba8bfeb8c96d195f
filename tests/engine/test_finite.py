"""FiniteGuard: non-finite losses, gradient norms and weights stop the run with the step and the value,
fp16's skipped steps excepted (one process: the verdict is one all_reduce, tested on 2 ranks end to end); SyncBN
ranks out of step stop it with their own error (2 gloo ranks)."""
from __future__ import annotations

import math

import pytest
import torch

from src.engine.finite import FiniteGuard, NonFiniteError
from src.syncbn import SyncBatchNormOutOfStepError
from tests.support.gloo import run_on_ranks
from tests.syncbn.out_of_step_cases import run_scenario

CPU = torch.device("cpu")
FINE = {"w": torch.ones(3)}


def observe(guard: FiniteGuard, losses: list[float], norms: list[float] | None = None) -> None:
    for step, loss in enumerate(losses, start=1):
        norm = None if norms is None else torch.tensor(norms[step - 1])
        guard.observe(step, torch.tensor(loss), norm)


def test_finite_steps_pass_and_the_first_bad_one_is_named() -> None:
    guard = FiniteGuard(CPU)
    observe(guard, [2.0, 1.5])
    guard.check(FINE, "at step 2")  # nothing to report
    observe(guard, [1.0, math.nan, math.inf])
    with pytest.raises(NonFiniteError, match=r"the loss was nan at optimizer step 2 \(2 of the 3 step\(s\)"):
        guard.check(FINE, "at step 3", "lr now 1e+06")


def test_a_non_finite_gradient_norm_is_named_as_such() -> None:
    guard = FiniteGuard(CPU)
    observe(guard, [1.0, 1.0], norms=[0.5, math.inf])
    with pytest.raises(NonFiniteError, match="gradient norm was inf at optimizer step 2"):
        guard.check(FINE, "at step 2")


def test_non_finite_weights_stop_even_when_every_loss_was_finite() -> None:
    guard = FiniteGuard(CPU)
    observe(guard, [1.0])
    with pytest.raises(NonFiniteError, match=r"weights are no longer finite \(bn.running_var=nan\).*Usual causes"):
        guard.check({"w": torch.ones(2), "bn.running_var": torch.tensor([0.0, math.nan])}, "before step 1")


def test_grad_scaler_skipped_steps_pass_unless_every_step_was_skipped() -> None:
    guard = FiniteGuard(CPU, skipped_steps_allowed=True)
    observe(guard, [1.0, math.inf, 1.0])
    guard.check(FINE, "at step 3")  # one skipped step among three: the scaler's business
    observe(guard, [math.inf, math.nan])
    with pytest.raises(NonFiniteError, match="2 of the 2 step"):
        guard.check(FINE, "at step 5")


def _guard_verdict(model: torch.nn.Module, rank: int) -> str | None:
    """What the trainer's check says after the scenario: its error's message, or None. Every step's loss is
    finite and fp16's skipped steps are allowed: only the layers can stop it."""
    guard = FiniteGuard(CPU, skipped_steps_allowed=True, model=model)
    observe(guard, [1.0, 1.0, 1.0])
    try:
        guard.check(FINE, "at step 3")
    except SyncBatchNormOutOfStepError as err:
        return str(err)
    return None


@pytest.mark.parametrize("scenario", ["eval_one_step", "in_step"])
def test_syncbn_ranks_out_of_step_stop_the_run_naming_the_layer(scenario: str) -> None:
    """2 gloo ranks (tests/syncbn/out_of_step_cases.py): rank 1 trained one step in eval mode, or nothing odd."""
    results = run_on_ranks(2, run_scenario, {"scenario": scenario, "device": "cpu", "then": _guard_verdict})
    for rank, record in enumerate(results):
        if scenario == "in_step":
            assert record["then"] is None, f"rank {rank}: {record['then']}"
            continue
        assert record["then"] is not None, f"rank {rank}: the check let ranks out of step pass"
        assert record["then"].startswith("training stopped: SyncBatchNorm's ranks are out of step: layer 'bn1'")
        assert "Detected at step 3" in record["then"] and "(`.eval()`)" in record["then"]
