"""SyncBN on 2, 3 and 4 real gloo processes == one-process nn.BatchNorm on the concatenated batch.

Each world size is one task on that size's worker pool running every case (tests/support/gloo.py); each
case is then its own test.
What is compared and at which tolerance: bn_cases.py.
"""
from __future__ import annotations

import pytest
import torch

from tests.syncbn.bn_cases import compare, make_case, run_cases
from tests.support.gloo import run_on_ranks

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def _shapes(batches: list[int], rest: tuple[int, ...], channels: int, world: int, steps: int = 1) -> list:
    """Per-step, per-rank shapes: rank r holds batches[r] samples (varied a little per step)."""
    return [[((batches[r] + s) if batches[r] else 0, channels) + rest for r in range(world)] for s in range(steps)]


# name -> (layer class, channels, per-rank batch sizes for up to 3 ranks, trailing dims, make_case options)
CASES = {
    "bn1d_nc_equal": ("1d", 5, [4, 4, 4], (), {}),
    "bn1d_ncl_unequal": ("1d", 3, [3, 5, 1], (7,), {}),
    "bn2d_equal": ("2d", 4, [2, 2, 2], (5, 6), {}),
    "bn2d_unequal": ("2d", 4, [1, 3, 2], (3, 4), {}),
    "bn3d_unequal": ("3d", 3, [2, 1, 3], (3, 4, 2), {}),
    "generic_2d": ("generic", 4, [3, 2, 2], (), {}),
    "generic_5d": ("generic", 2, [1, 2, 1], (2, 3, 2), {}),
    "rank_with_zero_samples": ("2d", 3, [0, 4, 2], (3, 3), {}),
    "all_ranks_empty": ("2d", 3, [0, 0, 0], (3, 3), {"steps": 2}),
    "one_sample_per_rank": ("1d", 4, [1, 1, 1], (), {}),
    "one_rank_single_value": ("1d", 4, [1, 5, 2], (), {}),
    "affine_false": ("2d", 3, [2, 3, 1], (4, 4), {"kwargs": {"affine": False}}),
    "bias_false": ("2d", 3, [2, 3, 1], (4, 4), {"kwargs": {"bias": False}}),
    "no_running_stats": ("2d", 3, [2, 3, 1], (4, 4), {"kwargs": {"track_running_stats": False}}),
    "momentum_none_3_steps": ("2d", 3, [2, 1, 3], (3, 3), {"kwargs": {"momentum": None}, "steps": 3}),
    "momentum_eps_custom_2_steps": ("1d", 6, [3, 2, 4], (5,), {"kwargs": {"momentum": 0.3, "eps": 1e-3}, "steps": 2}),
    "channels_last": ("2d", 5, [2, 3, 1], (4, 5), {"fmt": "channels_last"}),
    "channels_last_3d": ("3d", 4, [2, 1, 2], (2, 3, 4), {"fmt": "channels_last_3d"}),
    "strided_input": ("2d", 3, [2, 3, 1], (4, 4), {"fmt": "strided"}),
    "float64": ("2d", 3, [3, 2, 4], (4, 5), {"dtype": torch.float64, "steps": 2}),
    "float64_large_mean": ("2d", 3, [3, 2, 4], (4, 5), {"dtype": torch.float64, "loc": 1e4}),
    "float32_large_mean": ("2d", 3, [4, 4, 4], (6, 6), {"loc": 1e4}),
    "bfloat16": ("2d", 4, [2, 3, 1], (5, 5), {"dtype": torch.bfloat16, "steps": 2}),
    "float16": ("2d", 4, [2, 3, 1], (5, 5), {"dtype": torch.float16}),
    "bfloat16_channels_last": ("2d", 4, [2, 3, 1], (5, 5), {"dtype": torch.bfloat16, "fmt": "channels_last"}),
}


def _build(world: int) -> list[dict]:
    cases = []
    for i, (name, (cls, c, batches, rest, opts)) in enumerate(CASES.items()):
        opts = dict(opts)
        steps = opts.pop("steps", 1)
        cases.append(make_case(name, cls, c, _shapes(batches, rest, c, world, steps), seed=100 * world + i, **opts))
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
    return [pairs, pairs_cl, singles]


@pytest.mark.parametrize("device", DEVICES)
def test_process_subgroups(device: str) -> None:
    cases = _subgroup_cases()
    results = run_on_ranks(4, run_cases, {"device": device, "cases": cases})
    compare(cases[0], results, [[0, 1], [2, 3]])
    compare(cases[1], results, [[0, 1], [2, 3]])
    compare(cases[2], results, [[0], [1], [2], [3]])
