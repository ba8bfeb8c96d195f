"""create_stats_group: SyncBN's collectives move to a group of their own, with results bit-identical to WORLD's."""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from src.syncbn import SyncBatchNorm2d, create_stats_group
from src.syncbn.collectives import resolve_group
from tests.support.gloo import run_on_ranks


def _one_step(layer: SyncBatchNorm2d, x: torch.Tensor) -> dict[str, torch.Tensor]:
    x = x.clone().requires_grad_(True)
    y = layer(x)
    (y * torch.arange(y.numel(), dtype=y.dtype).view_as(y)).sum().backward()
    return {"y": y.detach(), "dx": x.grad, "dw": layer.weight.grad, "rm": layer.running_mean, "rv": layer.running_var}


def _stats_group_vs_world(rank: int, world: int, payload: Any) -> dict[str, Any]:
    before = resolve_group(None)[0]
    group = create_stats_group(timeout_s=60)
    assert create_stats_group() is group  # created once
    torch.manual_seed(rank)
    x = torch.randn(2 + rank, 3, 4, 5, dtype=torch.float64) * 3 + 7
    own = _one_step(SyncBatchNorm2d(3, dtype=torch.float64), x)  # process_group=None: the stats group
    on_world = _one_step(SyncBatchNorm2d(3, dtype=torch.float64, process_group=dist.group.WORLD), x)
    return {"before": before, "after": resolve_group(None), "stats": group.group_name,
            "world": dist.group.WORLD.group_name,
            "equal": all(torch.equal(own[k], on_world[k]) for k in own)}


def test_layers_without_a_group_use_the_stats_group_with_identical_results() -> None:
    for r in run_on_ranks(2, _stats_group_vs_world, None):
        assert r["before"] == r["world"]  # nothing created yet: WORLD
        assert r["after"] == (r["stats"], 2) and r["stats"] != r["world"]
        assert r["equal"]
