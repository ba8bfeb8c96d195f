"""The communication protocol on 2 real gloo processes: eval never communicates, errors never hang.

(Exactly one collective per training forward and one per backward is asserted for every case of
test_distributed_equivalence.py.)
"""
from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from src.syncbn import SyncBatchNorm1d, SyncBatchNorm2d, collectives
from tests.syncbn.bn_cases import build_layer, compare, make_case, make_groups, train_step
from tests.support.gloo import run_on_ranks

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
# Short collective timeout: if eval on one rank issued a collective, the peers' next collective would
# pair with it and the last one would wait for a partner that never comes -> fails in 20 s, not 15 min.
TIMEOUT_S = 20.0


def run_protocol(rank: int, world: int, payload: dict) -> dict[str, Any]:
    """Child: training step, eval on rank 0 only, training step; then a whole-group error and recovery."""
    device = payload["device"]
    groups = make_groups(world)
    case = payload["eval_case"]
    layer = build_layer(case, None, device)
    out: dict[str, Any] = {"eval_one_rank": [train_step(layer, case, case["steps"][0], rank, device)]}
    if rank == 0:
        x = payload["eval_x"].to(device)
        before = dict(collectives.call_counts)
        layer.eval()
        ys = [layer(x) for _ in range(3)]
        no_stats = SyncBatchNorm2d(3, track_running_stats=False, device=device).eval()
        y_batch = no_stats(x)  # eval without running stats: this batch's own statistics, still local
        out["eval_calls"] = {k: collectives.call_counts[k] - before[k] for k in before}
        out["eval_matches"] = all(
            torch.allclose(y, F.batch_norm(x, layer.running_mean, layer.running_var, layer.weight, layer.bias,
                                           False, 0.0, layer.eps), atol=1e-5) for y in ys
        ) and torch.allclose(y_batch, F.batch_norm(x, None, None, training=True), atol=1e-5)
        layer.train()
    out["eval_one_rank"].append(train_step(layer, case, case["steps"][1], rank, device))

    # Rank 0 holds one sample, rank 1 none: one value per channel in the whole group. Every rank
    # must raise F.batch_norm's ValueError (none may wait in a collective), and the group stays usable.
    tiny = SyncBatchNorm1d(3, device=device)
    try:
        tiny(torch.randn(1 if rank == 0 else 0, 3, device=device))
        out["error"] = None
    except ValueError as exc:
        out["error"] = str(exc)
    after = payload["after_error_case"]
    out["after_error"] = [train_step(build_layer(after, groups["world"][0], device), after, after["steps"][0], rank, device)]
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_eval_on_one_rank_and_group_wide_error(device: str) -> None:
    eval_case = make_case("eval_one_rank", "2d", 3, [[(2, 3, 4, 4), (3, 3, 4, 4)]] * 2, seed=1)
    after_case = make_case("after_error", "1d", 3, [[(2, 3), (3, 3)]], seed=2)
    payload = {"device": device, "eval_case": eval_case, "after_error_case": after_case,
               "eval_x": torch.randn(4, 3, 4, 4)}
    results = run_on_ranks(2, run_protocol, payload, timeout_s=TIMEOUT_S)
    assert results[0]["eval_calls"] == {"all_gather": 0, "all_reduce": 0, "received": 0}
    assert results[0]["eval_matches"]
    compare(eval_case, results, [[0, 1]])  # both training steps exact: no stray collective in between
    for r in range(2):
        assert results[r]["error"] is not None, f"rank {r} did not raise"
        assert "Expected more than 1 value per channel when training" in results[r]["error"]
    compare(after_case, results, [[0, 1]])
