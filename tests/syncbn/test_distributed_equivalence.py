"""SyncBN on 2, 3 and 4 real gloo processes == one-process nn.BatchNorm on the concatenated batch.

Each world size is one task on that size's worker pool running every case (tests/support/gloo.py); each
case is then its own test.
What is compared and at which tolerance: bn_cases.py.
"""
from __future__ import annotations

import pytest

from tests.syncbn.bn_cases import compare, make_case, run_cases
from tests.syncbn.equivalence_cases import CASES, shapes
from tests.support.gloo import run_on_ranks

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def _build(world: int) -> list[dict]:
    cases = []
    for i, (name, (cls, c, batches, rest, opts)) in enumerate(CASES.items()):
        opts = dict(opts)
        steps = opts.pop("steps", 1)
        cases.append(make_case(name, cls, c, shapes(batches, rest, c, world, steps), seed=100 * world + i, **opts))
    return cases


WORLD_PARAMS = [
    pytest.param((w, d), id=f"W{w}-{d}", marks=[pytest.mark.cuda] if d == "cuda" else [])
    for w in (2, 3) for d in ("cpu", "cuda")
]


@pytest.fixture(scope="module", params=WORLD_PARAMS)
def world_results(request: pytest.FixtureRequest) -> tuple:
    """One task on W ranks runs every case; returns (world, cases by name, per-rank results)."""
    world, device = request.param
    cases = _build(world)
    results = run_on_ranks(world, run_cases, {"device": device, "cases": cases})
    return world, {c["name"]: c for c in cases}, results


@pytest.mark.parametrize("name", list(CASES))
def test_matches_one_process_batchnorm(world_results: tuple, name: str) -> None:
    world, cases, results = world_results
    compare(cases[name], results, [list(range(world))])


def _subgroup_cases() -> list[dict]:
    # Ranks {0,1} and {2,3} normalise over their own pair only, on different data and batch sizes.
    pairs = make_case("pairs", "2d", 3, [[(2, 3, 4, 4), (3, 3, 4, 4), (1, 3, 4, 4), (4, 3, 4, 4)]] * 2,
                      group="pairs", seed=7, kwargs={"momentum": None})
    pairs_cl = make_case("pairs_channels_last", "2d", 3, [[(2, 3, 4, 4), (0, 3, 4, 4), (1, 3, 4, 4), (2, 3, 4, 4)]],
                         group="pairs", seed=8, fmt="channels_last")
    # A group of one rank: plain batch norm, and no collective at all.
    singles = make_case("singles", "2d", 3, [[(2, 3, 4, 4), (3, 3, 4, 4), (2, 3, 4, 4), (5, 3, 4, 4)]],
                        group="single", seed=9)
    # The whole group of 4: two all_reduces bringing 2C+1 values per forward, as at 2 and 3 ranks.
    world4 = make_case("world4", "2d", 3, [[(2, 3, 4, 4), (0, 3, 4, 4), (3, 3, 4, 4), (1, 3, 4, 4)]] * 2, seed=10)
    return [pairs, pairs_cl, singles, world4]


@pytest.mark.parametrize("device", DEVICES)
def test_process_subgroups(device: str) -> None:
    cases = _subgroup_cases()
    results = run_on_ranks(4, run_cases, {"device": device, "cases": cases})
    compare(cases[0], results, [[0, 1], [2, 3]])
    compare(cases[1], results, [[0, 1], [2, 3]])
    compare(cases[2], results, [[0], [1], [2], [3]])
    compare(cases[3], results, [[0, 1, 2, 3]])
