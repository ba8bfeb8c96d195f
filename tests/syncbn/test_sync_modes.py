"""sync_every and sync_until_step on 2 real gloo processes (3 + 5 images), float64: what synchronises when.

A synchronised forward must equal nn.BatchNorm on the concatenated batch, a local one nn.BatchNorm on
this rank's batch alone, and each backward must match its own forward (global sums and one all_reduce
after a synchronised forward, local sums and no collective after a local one). The oracle is one float64
nn.BatchNorm per rank fed, step by step, either the whole batch or the rank's own: that is also how the
running statistics must evolve (global updates on synchronised steps, per-rank ones otherwise).
"""
from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from src.syncbn import SyncBatchNorm2d, collectives, configure_sync, set_optimizer_step
from tests.syncbn.bn_cases import build_layer, collective_calls, make_case, train_step
from tests.support.gloo import run_on_ranks

BATCHES = (3, 5)
STEPS = 7
# float64 throughout: only summation order differs from the oracle (~1e-15 relative); 1e-10 catches any bug.
TOL = 1e-10


def _case(name: str, seed: int) -> dict:
    shapes = [[(b, 4, 3, 3) for b in BATCHES] for _ in range(STEPS)]
    return make_case(name, "2d", 4, shapes, dtype=torch.float64, seed=seed, kwargs={"momentum": 0.3})


def _every_3(rank: int, case: dict) -> list[dict]:
    layer = build_layer(case, None, "cpu")
    configure_sync(layer, sync_every=3)
    return [train_step(layer, case, step, rank, "cpu") for step in case["steps"]]


def _until_step_4(rank: int, case: dict) -> list[dict]:
    """Two forwards per optimizer step (accumulation); the trainer tells the layer the step after each."""
    layer = build_layer(case, None, "cpu")
    configure_sync(layer, sync_until_step=4)
    records = []
    for i, step in enumerate(case["steps"]):
        set_optimizer_step(layer, i // 2)
        records.append(train_step(layer, case, step, rank, "cpu"))
    return records


def _every_2_after_resume(rank: int, case: dict) -> list[dict]:
    """The sync_every phase comes from num_batches_tracked, so a layer restored after 3 forwards continues
    where an uninterrupted one would be (forward 3 local, forward 4 synchronised)."""
    first = build_layer(case, None, "cpu")
    configure_sync(first, sync_every=2)
    records = [train_step(first, case, step, rank, "cpu") for step in case["steps"][:3]]
    resumed = build_layer(case, None, "cpu")
    configure_sync(resumed, sync_every=2)
    resumed.load_state_dict(first.state_dict())
    return records + [train_step(resumed, case, step, rank, "cpu") for step in case["steps"][3:]]


def _two_forwards_one_backward(rank: int, case: dict) -> dict[str, Any]:
    """Forward 0 synchronised, forward 1 local, then one backward through both: each half follows its forward."""
    layer = build_layer(case, None, "cpu")
    configure_sync(layer, sync_every=2)
    steps = case["steps"][:2]
    xs = [s["x"][rank].clone().requires_grad_() for s in steps]
    before = dict(collectives.call_counts)
    ys = [layer(x) for x in xs]
    mid = dict(collectives.call_counts)
    sum((y * s["g"][rank]).sum() for y, s in zip(ys, steps)).backward()
    after = dict(collectives.call_counts)
    return {"y": [y.detach() for y in ys], "dx": [x.grad for x in xs],
            "fwd": {k: mid[k] - before[k] for k in mid}, "bwd": {k: after[k] - mid[k] for k in mid}}


def _child(rank: int, world: int, payload: dict) -> dict[str, Any]:
    cases = payload["cases"]
    return {"every_3": _every_3(rank, cases["every_3"]), "until_4": _until_step_4(rank, cases["until_4"]),
            "resume": _every_2_after_resume(rank, cases["resume"]),
            "two_forwards": _two_forwards_one_backward(rank, cases["two_forwards"])}


@pytest.fixture(scope="module")
def results() -> tuple[dict, list[dict]]:
    cases = {name: _case(name, 60 + i) for i, name in enumerate(("every_3", "until_4", "resume", "two_forwards"))}
    return cases, run_on_ranks(2, _child, {"cases": cases})


def _oracle(case: dict, synced: list[bool]) -> list[list[dict]]:
    """Per rank, per step: nn.BatchNorm fed the concatenated batch when synced, the rank's own otherwise."""
    out = []
    for rank in range(len(BATCHES)):
        bn = nn.BatchNorm2d(case["C"], momentum=0.3, dtype=torch.float64)
        with torch.no_grad():
            bn.weight.copy_(case["weight"])
            bn.bias.copy_(case["bias"])
        records = []
        for step, sync in zip(case["steps"], synced):
            members = list(range(len(BATCHES))) if sync else [rank]
            x = torch.cat([step["x"][m] for m in members]).requires_grad_()
            y = bn(x)
            y.backward(torch.cat([step["g"][m] for m in members]))
            start = sum(BATCHES[:rank]) if sync else 0
            rows = slice(start, start + BATCHES[rank])
            records.append({"y": y.detach()[rows], "dx": x.grad[rows], "dw": bn.weight.grad.clone(),
                            "db": bn.bias.grad.clone(), "rm": bn.running_mean.clone(), "rv": bn.running_var.clone()})
            bn.zero_grad(set_to_none=True)
        out.append(records)
    return out


def _check(case: dict, got: list[list[dict]], synced: list[bool]) -> None:
    ref = _oracle(case, synced)
    for s, sync in enumerate(synced):
        where = f"{case['name']} forward {s} ({'synchronised' if sync else 'local'})"
        for rank in range(len(BATCHES)):
            rec, exp = got[rank][s], ref[rank][s]
            for key in ("y", "dx", "rm", "rv"):
                torch.testing.assert_close(rec[key], exp[key], rtol=TOL, atol=TOL, msg=lambda m: f"{where} {key}: {m}")
            assert collective_calls(rec["fwd_calls"]) == {"all_gather": 0, "all_reduce": 2 * int(sync)}, where
            assert collective_calls(rec["bwd_calls"]) == {"all_gather": 0, "all_reduce": int(sync)}, where
        for key in ("dw", "db"):  # local parameter grads: their sum is the global grad when synchronised
            if sync:
                total = got[0][s][key] + got[1][s][key]
                torch.testing.assert_close(total, ref[0][s][key], rtol=TOL, atol=TOL)
            else:
                for rank in range(len(BATCHES)):
                    torch.testing.assert_close(got[rank][s][key], ref[rank][s][key], rtol=TOL, atol=TOL)


def test_sync_every_3(results: tuple) -> None:
    cases, got = results
    _check(cases["every_3"], [r["every_3"] for r in got], [s % 3 == 0 for s in range(STEPS)])


def test_sync_until_step_4(results: tuple) -> None:
    cases, got = results
    _check(cases["until_4"], [r["until_4"] for r in got], [s // 2 < 4 for s in range(STEPS)])


def test_sync_every_phase_survives_load_state_dict(results: tuple) -> None:
    cases, got = results
    _check(cases["resume"], [r["resume"] for r in got], [s % 2 == 0 for s in range(STEPS)])


def test_backward_follows_each_forward(results: tuple) -> None:
    cases, got = results
    case = cases["two_forwards"]
    ref = _oracle(case, [True, False])
    for rank, rec in enumerate(got):
        assert collective_calls(rec["two_forwards"]["fwd"]) == {"all_gather": 0, "all_reduce": 2}
        assert collective_calls(rec["two_forwards"]["bwd"]) == {"all_gather": 0, "all_reduce": 1}  # only forward 0's backward
        for i in (0, 1):
            torch.testing.assert_close(rec["two_forwards"]["y"][i], ref[rank][i]["y"], rtol=TOL, atol=TOL)
            torch.testing.assert_close(rec["two_forwards"]["dx"][i], ref[rank][i]["dx"], rtol=TOL, atol=TOL)


def test_defaults_and_eval_never_change_behaviour() -> None:
    layer = SyncBatchNorm2d(3)
    assert (layer.group_size, layer.sync_every, layer.sync_until_step) == (None, 1, None)
    assert "sync_every" not in repr(layer)
    assert configure_sync(nn.Sequential(layer, nn.ReLU()), sync_every=4, sync_until_step=10) == 1
    assert "sync_every=4, sync_until_step=10" in repr(layer)
    with pytest.raises(ValueError, match="sync_every must be an int >= 1"):
        configure_sync(layer, sync_every=0)
    with pytest.raises(ValueError, match="sync_until_step must be an int >= 0 or None"):
        configure_sync(layer, sync_until_step=-2)
    with pytest.raises(ValueError, match="group_size must be an int >= 1, or null/None for all ranks"):
        configure_sync(layer, group_size=0)

