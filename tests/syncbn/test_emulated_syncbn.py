"""SyncBatchNorm on 2 real gloo processes running our CUDA kernels (emulated on the CPU) == one-process
nn.BatchNorm on the concatenated batch: forward, all gradients, running statistics (bn_cases.py).

SYNCTRAIN_SYNCBN_KERNELS=cuda-emulated, set before the ranks start (they read it at their first SyncBN
call), makes src.syncbn.functions.kernel_ops() return the emulated build in the ranks; the emulated device is a 16-SM Orin, whose few
resident blocks split these small batches across several blocks per channel. A subset of the CPU
equivalence cases (test_distributed_equivalence.py) that covers layouts, dtypes, empty ranks and the
cumulative momentum. Rank 0 runs the kernels in forward lane, warp and block order, rank 1 in reverse. Also a
step taken in eval mode on one rank: NaN statistics on both, and the layer named (out_of_step_cases.py).
"""
from __future__ import annotations

import pytest

from tests.syncbn.bn_cases import compare, make_case, run_cases
from tests.support.gloo import run_on_ranks
from tests.syncbn.equivalence_cases import CASES as EQUIVALENCE_CASES, shapes
from tests.syncbn.out_of_step_cases import check_scenario, run_scenario

pytestmark = pytest.mark.cuda_emulated

SUBSET = ["bn2d_unequal", "bn3d_unequal", "rank_with_zero_samples", "all_ranks_empty", "one_rank_single_value",
          "affine_false", "momentum_none_3_steps", "channels_last", "channels_last_3d", "strided_input", "float64",
          "float16", "bfloat16_channels_last"]
WORLD = 2
# Each rank runs its kernels under its own schedule (csrc/simt/schedule.h), so every layer of every case
# runs them in forward and in reverse lane, warp and block order (on the two ranks' halves of the batch).
RANK_SCHEDULES = ["forward", "reverse"]


def run_emulated(rank: int, world: int, payload: dict) -> dict:
    """run_cases on this rank, plus which kernels ran and how many emulated launches they made."""
    from src.syncbn.functions import kernel_ops

    emulation = kernel_ops().module
    emulation.set_schedule(payload["schedules"][rank])
    before = emulation.counters()["launches"]
    results = run_cases(rank, world, payload)
    launches = emulation.counters()["launches"] - before
    # Rank 1 takes a step in eval mode: the emulated kernels must turn the poisoned sums into NaN statistics too.
    out_of_step = run_scenario(rank, world, {"scenario": "eval_one_step", "device": "cpu"})
    return {"ops": emulation.__name__, "launches": launches, "results": results, "out_of_step": out_of_step}


@pytest.fixture(scope="module")
def world_results() -> tuple:
    cases = []
    for i, name in enumerate(SUBSET):
        cls, c, batches, rest, opts = EQUIVALENCE_CASES[name]
        opts = dict(opts)
        steps = opts.pop("steps", 1)
        cases.append(make_case(name, cls, c, shapes(batches, rest, c, WORLD, steps), seed=900 + i, **opts))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SYNCTRAIN_SYNCBN_KERNELS", "cuda-emulated")
        mp.setenv("SYNCTRAIN_SIMT_DEVICE", "orin")
        payload = {"device": "cpu", "cases": cases, "schedules": RANK_SCHEDULES}
        # fresh=True: the ranks are started here, so they inherit both variables. SYNCTRAIN_SIMT_DEVICE is read
        # once per process (extension.emulated_cuda_ops), and the emulated module is one per process and keeps
        # its device and schedule: a reused worker would run these cases on whatever device and schedule an
        # earlier task left, and would pass this test's orin device and reverse schedule on to later tasks.
        out = run_on_ranks(WORLD, run_emulated, payload, fresh=True)
    return {c["name"]: c for c in cases}, out


def test_ranks_ran_the_emulated_cuda_kernels(world_results):
    _, out = world_results
    for rank in out:
        assert rank["ops"].startswith("syncbn_cudaemu_") and rank["launches"] > 0, rank["ops"]


@pytest.mark.parametrize("name", SUBSET)
def test_matches_one_process_batchnorm(world_results, name: str) -> None:
    cases, out = world_results
    compare(cases[name], [rank["results"] for rank in out], [list(range(WORLD))])


def test_ranks_out_of_step_are_nan_and_named(world_results) -> None:
    _, out = world_results
    check_scenario("eval_one_step", [rank["out_of_step"] for rank in out])


def test_unknown_kernel_choice_is_an_error(monkeypatch):
    from src.syncbn import functions

    monkeypatch.setenv("SYNCTRAIN_SYNCBN_KERNELS", "cuda-emulate")
    monkeypatch.setattr(functions, "_OPS", None)  # as in a fresh process: the variable is read at first use
    with pytest.raises(ValueError, match="SYNCTRAIN_SYNCBN_KERNELS='cuda-emulate': expected 'cuda-emulated' or unset"):
        functions.kernel_ops()
