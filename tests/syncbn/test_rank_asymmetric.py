"""Calls that change a layer on one rank only leave the group's statistics exact (2 and 3 real gloo ranks).

A layer that kept exchange state outside its parameters and buffers (say, a per-rank shift of the summed
statistics) could be reset by `.float()`, `.to()`, `.half()`, `reset_running_stats()` or `configure_sync()` on
one rank and not on the others; every later step would then merge inconsistent sums without any error (float32
data at 5 + N(0, 1): outputs off by ~3 against BatchNorm). Here each of those calls is made between two training
steps on one rank only, and every rank's output and input gradient of every step must still match one-process
float64 nn.BatchNorm on the concatenated batch. The parameters are multiples of 1/64, so a round trip through
float16 leaves them unchanged and the group's ranks compute with identical weights.
"""
from __future__ import annotations

from typing import Any

import pytest
import torch

from src.syncbn import configure_sync
from tests.support.gloo import run_on_ranks
from tests.syncbn.bn_cases import TOL, build_layer, check_close, make_case, oracle, train_step

CALLS = {
    "float": lambda m: m.float(),
    "to_dtype": lambda m: m.to(torch.float32),
    "to_device": lambda m: m.to("cpu"),
    "half_and_back": lambda m: m.half().float(),
    "reset_running_stats": lambda m: m.reset_running_stats(),
    "configure_sync": lambda m: configure_sync(m),
}
STEPS = 3


def _case(world: int) -> dict:
    shapes = [[(3 + r, 4, 5, 5) for r in range(world)] for _ in range(STEPS)]
    case = make_case("asymmetric", "2d", 4, shapes, loc=5.0, seed=70 + world)
    for key in ("weight", "bias"):
        case[key] = (case[key] * 64).round() / 64  # exact in float16
    return case


def _rank(rank: int, world: int, case: dict, changed: int) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for name, call in CALLS.items():
        layer = build_layer(case, None, "cpu")
        records = []
        for s, step in enumerate(case["steps"]):
            if s == 1 and rank == changed:  # after a synchronised step: whatever it left behind is now in place
                call(layer)
            records.append(train_step(layer, case, step, rank, "cpu"))
        out[name] = records
    return out


@pytest.mark.parametrize("world", [2, 3], ids=["W2", "W3"])
def test_a_call_on_one_rank_keeps_every_step_exact(world: int) -> None:
    case = _case(world)
    changed = world - 2  # rank 0 of 2, rank 1 of 3
    results = run_on_ranks(world, _rank, case, changed)
    expected = oracle(case, list(range(world)))
    for name in CALLS:
        for s, exp in enumerate(expected):
            for rank in range(world):
                got = results[rank][name][s]
                where = f"{name} on rank {changed}, step {s}, rank {rank} of {world}"
                check_close(got["y"], exp["y"][rank], TOL[torch.float32], f"{where}: output")
                check_close(got["dx"], exp["dx"][rank], TOL[torch.float32], f"{where}: input grad")
