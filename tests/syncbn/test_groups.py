"""group_size=k: statistics over groups of k consecutive ranks, on real gloo processes, in float64.

4 processes with group_size=2 must equal two independent 2-process runs (ranks {0,1} on one pair's data,
{2,3} on the other's): checked against a real 2-process run on each pair's data and against the
one-process nn.BatchNorm oracle on each pair's concatenated batch (bn_cases.compare: outputs, input and
parameter grads, running statistics, collectives per forward/backward).
"""
from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from src.syncbn import SyncBatchNorm2d, configure_sync, create_rank_groups
from tests.syncbn.bn_cases import build_layer, collective_calls, compare, make_case, train_step
from tests.support.gloo import run_on_ranks

# Uneven per-rank batches (3 + 5 in the first pair), two steps so running statistics accumulate.
SHAPES = [[(3, 3, 4, 5), (5, 3, 4, 5), (2, 3, 4, 5), (4, 3, 4, 5)],
          [(4, 3, 4, 5), (1, 3, 4, 5), (3, 3, 4, 5), (3, 3, 4, 5)]]
CASES = {  # name -> group_size
    "k2": 2,
    "k4_is_the_world": 4,
    "k1_is_per_rank": 1,
}
# float64 on both sides; the 2-process run and the k=2 groups run the same kernels on the same slices in the
# same group order, so they agree to rounding (1e-12 leaves room for a different gloo reduction order).
RUN_TOL = 1e-12


def _cases() -> list[dict]:
    return [make_case(name, "2d", 3, SHAPES, dtype=torch.float64, seed=40 + i, kwargs={"momentum": None})
            for i, name in enumerate(CASES)]


def _with_group_size(rank: int, world: int, payload: dict) -> dict[str, Any]:
    """Every rank creates the groups once, then runs each case with layers that only know their group_size."""
    for k in sorted(set(CASES.values())):
        create_rank_groups(k, timeout_s=60)
    assert create_rank_groups(2) is create_rank_groups(2)  # created once: later calls return the same group
    out: dict[str, Any] = {}
    for case in payload["cases"]:
        layer = build_layer(case, None, "cpu")
        configure_sync(layer, group_size=CASES[case["name"]])
        layer = copy.deepcopy(layer)  # holds an int, not a ProcessGroup: deep-copyable (EMA) and picklable
        out[case["name"]] = [train_step(layer, case, step, rank, "cpu") for step in case["steps"]]
    # A group size whose groups were never created fails clearly instead of guessing (no collective issued).
    stray = SyncBatchNorm2d(3, dtype=torch.float64)
    configure_sync(stray, group_size=3)
    try:
        stray(torch.randn(2, 3, 2, 2, dtype=torch.float64))
    except RuntimeError as err:
        out["not_created"] = str(err)
    try:
        create_rank_groups(3)  # does not divide 4: refused before any new_group call
    except ValueError as err:
        out["bad_size"] = str(err)
    return out


def _two_process_runs(rank: int, world: int, payload: dict) -> list[list[dict]]:
    """A plain 2-process SyncBN run (WORLD) on pair 0's data, then an independent one on pair 1's."""
    case = payload["case"]
    runs = []
    for pair in (0, 1):
        layer = build_layer(case, None, "cpu")
        runs.append([train_step(layer, case, step, 2 * pair + rank, "cpu") for step in case["steps"]])
    return runs


@pytest.fixture(scope="module")
def four_ranks() -> tuple[dict[str, dict], list[dict]]:
    cases = _cases()
    results = run_on_ranks(4, _with_group_size, {"cases": cases})
    return {c["name"]: c for c in cases}, results


def test_group_size_2_equals_two_independent_2_process_runs(four_ranks: tuple) -> None:
    cases, four = four_ranks
    compare(cases["k2"], four, [[0, 1], [2, 3]])  # vs the one-process oracle on each pair's batch
    two = run_on_ranks(2, _two_process_runs, {"case": cases["k2"]})
    for pair in (0, 1):
        for local in (0, 1):
            for step, (got, ran) in enumerate(zip(four[2 * pair + local]["k2"], two[local][pair])):
                for key in ("y", "dx", "dw", "db", "rm", "rv"):
                    torch.testing.assert_close(got[key], ran[key], rtol=RUN_TOL, atol=RUN_TOL,
                                               msg=lambda m: f"pair {pair} rank {local} step {step} {key}: {m}")
                assert got["fwd_calls"] == ran["fwd_calls"]
                assert collective_calls(got["fwd_calls"]) == {"all_gather": 0, "all_reduce": 2}
                assert got["bwd_calls"] == ran["bwd_calls"]
                assert collective_calls(got["bwd_calls"]) == {"all_gather": 0, "all_reduce": 1}


def test_group_size_world_and_one(four_ranks: tuple) -> None:
    cases, four = four_ranks
    compare(cases["k4_is_the_world"], four, [[0, 1, 2, 3]])
    compare(cases["k1_is_per_rank"], four, [[0], [1], [2], [3]])  # also: no collective at all


def test_missing_or_bad_groups_are_clear_errors(four_ranks: tuple) -> None:
    _, four = four_ranks
    for rank in four:
        assert "group_size=3, but its groups were not created in this process group: call " \
               "src.syncbn.create_rank_groups(3) on every rank" in rank["not_created"]
        assert "group_size=3 must divide the number of processes (4)" in rank["bad_size"] and "[1, 2, 4]" in rank["bad_size"]
