"""The self-check's gate on 2 gloo processes with the emulated kernels (src/syncbn/selfcheck.py:
agree_on_selfcheck): a PyTorch reference op that raises, a cache folder that cannot be written, a kernel
of ours that raises or is wrong on one rank: the ranks end without a hang and agree (fallback: all False;
error: all raise SelfCheckError naming the failing rank). The layers' own first-use check (check_first_use)
agrees the same way on the layer's group, with the faulty emulated build on one rank. And the device-sized
cases (selfcheck_cases.py: device_cases) reach the launch branches they are there for.

The wrong result on one rank is injected in Python (the same doubled value as the SYNCTRAIN_SELFCHECK_FAULT
build, whose detection tests/syncbn/test_selfcheck.py covers): one run on 2 ranks then serves every scenario,
with one emulated build per process."""
from __future__ import annotations

import logging
import math
import os
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from src.syncbn import selfcheck
from src.syncbn import selfcheck_cases as sc
from src.syncbn.extension import build, load_emulated_cuda_extension, make_emulated_spec
from tests.support.gloo import run_on_ranks

pytestmark = pytest.mark.cuda_emulated

SMALL_DEVICE = "orin,sm_count=1"  # 1 SM x 1536 threads: 6 resident blocks, so the device cases stay small
CASES = (sc.CASES[0],)  # one case in float32: the gate's behaviour, not the kernels', is under test here
DTYPES = (torch.float32,)
COLLECTIVE_TIMEOUT_S = 30.0  # a rank left waiting in the all_reduce fails the test well before the deadline


@pytest.fixture
def small_emu():
    """The emulated kernels on SMALL_DEVICE, recording launches; the process-wide device restored after."""
    module = load_emulated_cuda_extension(SMALL_DEVICE)
    yield module
    module.record_launches(False)
    module.set_device("h100")


def test_device_cases_reach_their_branches_and_pass(small_emu):
    """On 6 resident blocks: the channels-first case splits its planes (N) across blocks, and the
    channels-last case gives whole unrolled 4-row chunks (3 x stride < rows) in every dtype."""
    fields = dict(small_emu.device())
    resident = sc.resident_blocks(fields["sm_count"], fields["max_threads_per_sm"])
    assert resident == 6
    split_n, unroll = sc.device_cases(resident)
    small_emu.record_launches(True)
    report = selfcheck.run_selfcheck(small_emu, "cpu", cases=(split_n, unroll), dtypes=sc.DTYPES)
    launches = small_emu.launches()
    per_dtype = sum(6 * len(c.ranks) + 10 for c in (split_n, unroll))  # as in test_selfcheck.py
    assert report.comparisons == per_dtype * len(sc.DTYPES)
    first = [r for r in launches if "stats_channels_first_kernel" in r["kernel"]]
    last = [r for r in launches if "stats_channels_last_kernel" in r["kernel"]]
    assert len(first) == len(split_n.ranks) * len(sc.DTYPES) and len(last) == len(sc.DTYPES)
    for rec, planes in zip(first, split_n.ranks * len(sc.DTYPES)):
        # y-blocks split the planes and only the planes: more than one, no more than the planes need
        assert 1 < rec["grid"][1] <= math.ceil(planes / rec["block"][1]) and rec["block"][1] < planes, rec
    rows = unroll.shape[0] * unroll.shape[2] * unroll.shape[3]
    for rec in last:
        stride = rec["grid"][1] * rec["block"][1]
        assert 3 * stride < rows and int(re.search(r"(\d+)>$", rec["kernel"]).group(1)) > 1, rec


def test_device_cases_are_sized_for_an_h200():
    """132 SMs x 2048 threads: 1056 resident blocks; the channels-last case then has 3 x 128 x 1056 + 1
    rows or more, the channels-first one more than 32 planes per rank and fewer channels than blocks."""
    resident = sc.resident_blocks(132, 2048)
    split_n, unroll = sc.device_cases(resident)
    assert resident == 1056
    assert unroll.shape[0] * unroll.shape[2] * unroll.shape[3] > 3 * 128 * 1056 and unroll.ranks == (2,)
    assert min(split_n.ranks) > 32 and split_n.shape[1] < resident and split_n.shape[2:] == (2, 4)
    assert len(sc.cases_for(resident)) == len(sc.CASES) + 2


# --- 2 gloo processes -----------------------------------------------------------------------------------

class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _broken(ops, how: str):
    """ops with rank-local damage: "wrong" doubles channel 0's sum(dy * xhat) in backward_reduce (as the
    SYNCTRAIN_SELFCHECK_FAULT build does), "raises" makes batch_norm_elemt raise."""
    def backward_reduce(dy, x, mean, invstd):
        out = ops.batch_norm_backward_reduce(dy, x, mean, invstd).clone()
        out[x.shape[1]] *= 2
        return out

    def elemt(*args):
        raise RuntimeError("CUDA error: an illegal memory access was encountered (pretend)")

    return SimpleNamespace(batch_norm_stats=ops.batch_norm_stats, batch_norm_gather_stats=ops.batch_norm_gather_stats,
                           batch_norm_mean_sums=ops.batch_norm_mean_sums,
                           batch_norm_deviation_sums=ops.batch_norm_deviation_sums,
                           batch_norm_reduced_stats=ops.batch_norm_reduced_stats,
                           batch_norm_elemt=elemt if how == "raises" else ops.batch_norm_elemt,
                           batch_norm_backward_reduce=backward_reduce if how == "wrong"
                           else ops.batch_norm_backward_reduce,
                           batch_norm_backward_elemt=ops.batch_norm_backward_elemt)


def _gate_scenarios(rank: int, world: int, payload: dict) -> list[dict]:
    """Each scenario on this rank: the gate's result or error, its seconds, the warnings it logged."""
    import functools

    ops = load_emulated_cuda_extension("h100")
    handler = _Warnings()
    logging.getLogger("src.syncbn.selfcheck").addHandler(handler)
    plain_run = selfcheck.run_selfcheck
    results = []
    for sc_ in payload["scenarios"]:
        handler.lines.clear()
        # torch_reference=True on CPU tensors: every torch.batch_norm_* raises (no CPU kernel), as a reference
        # op missing on a GPU would.
        selfcheck.run_selfcheck = functools.partial(plain_run, torch_reference=sc_["torch_reference"])
        selfcheck.cache_path = lambda: Path(sc_["cache"])
        rank_ops = _broken(ops, sc_["broken"]) if sc_.get("broken") and rank == 1 else ops
        t0 = time.monotonic()
        try:
            out = {"result": selfcheck.agree_on_selfcheck(rank_ops, "cpu", sc_["mode"], f"emulated rank {rank}",
                                                          cases=CASES, dtypes=DTYPES)}
        except selfcheck.SelfCheckError as err:
            out = {"error": str(err)}
        out.update(seconds=time.monotonic() - t0, warnings=list(handler.lines),
                   cached=Path(sc_["cache"]).exists())
        results.append(out)
    return results


def _unwritable(tmp_path: Path) -> str:
    """A cache path whose folder cannot be created (its parent is a file): even root gets an OSError."""
    (tmp_path / "not_a_folder").write_text("")
    return str(tmp_path / "not_a_folder" / "selfcheck.json")


def test_ranks_agree_without_a_hang(tmp_path):
    """One run on 2 gloo ranks, four scenarios in turn (every torch reference raising and the cache
    unwritable in the fallback ones):
    - fallback, no fault: both ranks pass on float64 alone and return True; nothing is remembered;
    - fallback, rank 1's backward_reduce wrong: both return False;
    - error, rank 1's backward_reduce wrong: both raise SelfCheckError naming rank 1, within seconds;
    - error, rank 1's elemt raising: the same, and nobody remembers the pass rank 0 had."""
    build(make_emulated_spec(), import_module=False)  # here, under pytest's timeout, not in the ranks
    unwritable, ok = _unwritable(tmp_path), str(tmp_path / "ok" / "selfcheck.json")
    scenarios = [
        {"mode": "fallback", "torch_reference": True, "cache": unwritable},
        {"mode": "fallback", "torch_reference": True, "cache": unwritable, "broken": "wrong"},
        {"mode": "error", "torch_reference": False, "cache": ok, "broken": "wrong"},
        {"mode": "error", "torch_reference": False, "cache": ok, "broken": "raises"},
    ]
    # fresh=True: each rank replaces selfcheck.run_selfcheck and selfcheck.cache_path, adds a log handler and
    # switches the process's one emulated module to the h100 device; none of that may reach later tasks of a
    # reused worker, nor may an earlier task's emulated device or schedule reach this one.
    results = run_on_ranks(2, _gate_scenarios, {"scenarios": scenarios}, timeout_s=COLLECTIVE_TIMEOUT_S,
                           deadline_s=180, fresh=True)
    passed, fell_back, wrong, raised = ([rank[i] for rank in results] for i in range(len(scenarios)))
    assert [r.get("result") for r in passed] == [True, True], passed
    for r in passed:
        text = "\n".join(r["warnings"])
        assert "reference torch.batch_norm_stats unavailable (NotImplementedError" in text, text
        assert "could not be remembered" in text and not r["cached"], text
    assert [r.get("result") for r in fell_back] == [False, False], fell_back
    assert "op batch_norm_backward_reduce" in "\n".join(fell_back[1]["warnings"])
    assert "failed on rank 1; norm.cuda_selfcheck=fallback" in "\n".join(fell_back[0]["warnings"])
    for both in (wrong, raised):
        assert all("error" in r and r["seconds"] < 20 for r in both), both
        assert "failed on rank 1 (this rank passed" in both[0]["error"] and "norm=torch_syncbn" in both[0]["error"]
        assert "(the self-check failed on rank 1)" in both[1]["error"]
        assert not any(r["cached"] for r in both)  # a pass not all ranks had is not remembered
    assert "op batch_norm_backward_reduce" in wrong[1]["error"]
    assert "our kernels raised RuntimeError" in raised[1]["error"]


# --- Library use: the layers' first-use check, agreed on the layer's group --------------------------------------

def _first_use_scenarios(rank: int, world: int, payload: dict) -> list[dict]:
    """check_first_use on this rank, as a layer's first training forward runs it, with the emulated kernels: the
    faulty build (SYNCTRAIN_SELFCHECK_FAULT) on rank 1, the correct one on rank 0; one case in float32."""
    import functools

    from src.syncbn.collectives import resolve_group

    ops = load_emulated_cuda_extension("h100", fault=rank == 1)
    handler = _Warnings()
    logging.getLogger("src.syncbn.selfcheck").addHandler(handler)
    plain_check = selfcheck.check
    selfcheck.check = functools.partial(plain_check, ops=ops, use_cache=False, cases=CASES, dtypes=DTYPES)
    results = []
    for mode in payload["modes"]:
        os.environ[selfcheck.FIRST_USE_ENV] = mode
        selfcheck._CHECKED.clear()
        handler.lines.clear()
        t0 = time.monotonic()
        try:
            selfcheck.check_first_use(torch.device("cpu"), None, None)  # the layer's group: WORLD
            out = {"result": "went on"}
        except selfcheck.SelfCheckError as err:
            out = {"error": str(err)}
        out.update(seconds=time.monotonic() - t0, warnings=list(handler.lines), group=resolve_group(None)[1])
        results.append(out)
    return results


def test_first_use_check_agrees_across_the_layers_group():
    """2 gloo ranks, the faulty emulated build on rank 1: with SYNCTRAIN_SYNCBN_SELFCHECK=error both ranks raise
    (rank 1 naming the op, rank 0 naming rank 1) within seconds, none left waiting in a collective; with warn
    both log it and go on, together."""
    build(make_emulated_spec(), import_module=False)  # here, under pytest's timeout, not in the ranks
    build(make_emulated_spec(fault=True), import_module=False)
    results = run_on_ranks(2, _first_use_scenarios, {"modes": ["error", "warn"]}, timeout_s=COLLECTIVE_TIMEOUT_S,
                           deadline_s=180, fresh=True)
    (error0, warn0), (error1, warn1) = results
    assert error0["group"] == error1["group"] == 2
    assert all("error" in r and r["seconds"] < 20 for r in (error0, error1)), (error0, error1)
    assert "failed on rank 1 (this rank passed" in error0["error"] and "norm=torch_syncbn" in error0["error"]
    assert "op batch_norm_backward_reduce" in error1["error"] and "(the self-check failed on rank 1)" in error1["error"]
    assert warn0["result"] == warn1["result"] == "went on"
    assert "failed on rank 1 (this rank passed" in "\n".join(warn0["warnings"])
    assert "op batch_norm_backward_reduce" in "\n".join(warn1["warnings"])
    assert all("SYNCTRAIN_SYNCBN_SELFCHECK=warn" in "\n".join(r["warnings"]) for r in (warn0, warn1))
