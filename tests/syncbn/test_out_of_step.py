"""Ranks out of step are an error, not a wrong number: 2 real gloo ranks, float64 (scenarios: out_of_step_cases.py).

Before the exchange carried the call's identity, every scenario below completed with finite statistics merged from
different calls, and nothing said so (with the check left out, these tests fail on a finite output). Now the step whose
exchanges pair different calls gives NaN outputs and running statistics on *both* ranks, and `check_in_step`
names the layer and the causes on both; the steps before stay finite and unflagged (no false positive, also for
eval-mode forwards on one rank that no backward follows). The same with the all_gather exchange, and compiled
(fullgraph=True) where a rank's layer carries another index.
"""
from __future__ import annotations

from typing import Any

import pytest
import torch

from src.syncbn import SyncBatchNorm1d, SyncBatchNormOutOfStepError, check_in_step
from tests.support.gloo import run_on_ranks
from tests.syncbn.out_of_step_cases import EXPECTED, check_scenario, run_scenario

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(EXPECTED))
def test_out_of_step_is_nan_on_every_rank_and_named(name: str, device: str) -> None:
    check_scenario(name, run_on_ranks(2, run_scenario, {"scenario": name, "device": device}))


def test_the_all_gather_exchange_checks_too() -> None:
    name = "eval_one_step"
    results = run_on_ranks(2, run_scenario, {"scenario": name, "device": "cpu", "exchange": "all_gather"})
    check_scenario(name, results)


def _compiled_step(rank: int, world: int, payload: dict) -> dict[str, Any]:
    """A compiled (fullgraph) training step of one layer whose index differs between the ranks on the 2nd step."""
    torch._dynamo.reset()
    layer = SyncBatchNorm1d(3, dtype=torch.float64)
    layer.set_sync_layer_index(1)
    step = torch.compile(layer, fullgraph=True, backend="aot_eager")
    out = []
    for s in range(2):
        if s == 1 and rank == 1:
            layer.set_sync_layer_index(2)  # as if rank 1's model numbered its layers otherwise
        x = torch.randn(4 + rank, 3, dtype=torch.float64, requires_grad=True)
        y = step(x)
        y.sum().backward()
        try:
            check_in_step(layer)
            error = None
        except SyncBatchNormOutOfStepError as err:
            error = str(err)
        out.append({"y_finite": bool(torch.isfinite(y).all()), "dx_finite": bool(torch.isfinite(x.grad).all()),
                    "error": error})
    torch._dynamo.reset()
    return {"steps": out}


def test_compiled_exchange_checks_too() -> None:
    for rank, record in enumerate(run_on_ranks(2, _compiled_step, {})):
        first, second = record["steps"]
        assert first == {"y_finite": True, "dx_finite": True, "error": None}, f"rank {rank}: {first}"
        assert not second["y_finite"] and not second["dx_finite"], f"rank {rank}: {second}"
        assert second["error"] is not None and "layer '<root>'" in second["error"], f"rank {rank}: {second}"
