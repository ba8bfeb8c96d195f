"""Activation checkpointing keeps BatchNorm exact: a recomputation reuses the first forward's statistics.

Each case trains the same float64 model twice from the same weights and data, once plainly and once with
trainer.activation_checkpointing's regions (src/models/activation_checkpointing.py), and requires
parameters, gradients, running statistics and num_batches_tracked to agree to 1e-9. A recomputation that
updated the running statistics again would move running_mean by momentum * (batch mean - running mean),
~1e-2 here, and double num_batches_tracked; one that re-gathered would change the collective count.
"""
from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

from src.models import build_model, model_family
from src.models.activation_checkpointing import enable_activation_checkpointing
from src.syncbn import SyncBatchNorm2d, collectives
from tests.support.gloo import run_on_ranks
from tests.syncbn.bn_cases import collective_calls

pytestmark = pytest.mark.usefixtures("restores_rng")  # tests here seed torch's global generator

STEPS = 3
MICRO_BATCHES = 2  # gradient accumulation: two forwards (and two backwards) per optimizer step
TOL = dict(rtol=1e-9, atol=1e-9)  # float64; both runs compute the same ops in the same order


def _batches(seed: int, batch: int, size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 3, size, size, generator=gen, dtype=torch.float64) * 2 + 0.5,
             torch.randint(0, 5, (batch,), generator=gen)) for _ in range(STEPS * MICRO_BATCHES)]


def _train(model: nn.Module, module: nn.Module, batches: list, loss_of: Any = None) -> dict[str, Any]:
    """SGD steps of `module` (model or DDP(model)), MICRO_BATCHES batches each; state, last grads, collectives per step."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_of = loss_of or (lambda out, y: F.cross_entropy(out, y))
    per_step = []
    grads: dict[str, torch.Tensor] = {}
    for step in range(len(batches) // MICRO_BATCHES):
        before = dict(collectives.call_counts)
        for micro in range(MICRO_BATCHES):
            x, y = batches[step * MICRO_BATCHES + micro]
            (loss_of(module(x), y) / MICRO_BATCHES).backward()
        per_step.append(collective_calls({k: collectives.call_counts[k] - before[k] for k in before}))
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        opt.step()
        opt.zero_grad()
    return {"state": {k: v.detach().clone() for k, v in model.state_dict().items()}, "grads": grads,
            "collectives": per_step}


def _compare(plain: dict[str, Any], ckpt: dict[str, Any]) -> None:
    assert plain["state"].keys() == ckpt["state"].keys()  # checkpointing renames nothing
    for name, value in plain["state"].items():
        torch.testing.assert_close(ckpt["state"][name], value, **TOL, msg=name)
    assert plain["grads"].keys() == ckpt["grads"].keys()
    for name, value in plain["grads"].items():
        torch.testing.assert_close(ckpt["grads"][name], value, **TOL, msg=name)


def _two_runs(model_cfg: dict, norm: str, batches: list, *, ddp: bool = False,
              loss_of: Any = None) -> tuple[dict, dict]:
    results = []
    for checkpointed in (False, True):
        torch.manual_seed(0)
        model = build_model(model_cfg, {"name": norm}, 5).double().train()
        if checkpointed:
            assert enable_activation_checkpointing(model, model_family(model_cfg["name"]))
        module = DDP(model) if ddp else model
        results.append(_train(model, module, batches, loss_of))
    return results[0], results[1]


def _rank_runs(rank: int, world: int, payload: dict) -> dict:
    batches = [(x.chunk(world)[rank], y.chunk(world)[rank]) for x, y in payload["batches"]]
    plain, ckpt = _two_runs({"name": "resnet20"}, "syncbn", batches, ddp=True)
    return {"plain": plain, "ckpt": ckpt}


@pytest.mark.slow
def test_syncbn_resnet_checkpointed_on_two_processes_equals_plain() -> None:
    ranks = run_on_ranks(2, _rank_runs, {"batches": _batches(1, 8, 12)})
    for r in ranks:
        _compare(r["plain"], r["ckpt"])
        # ResNet-20: 19 SyncBN layers; two all_reduces per forward and one per backward each.
        expected = {"all_gather": 0, "all_reduce": 3 * 19 * MICRO_BATCHES}
        assert r["plain"]["collectives"] == [expected] * STEPS
        assert r["ckpt"]["collectives"] == r["plain"]["collectives"]
    _compare(ranks[0]["ckpt"], ranks[1]["ckpt"])  # and the ranks agree with each other


def test_bn_resnet_checkpointed_equals_plain() -> None:
    plain, ckpt = _two_runs({"name": "resnet20"}, "bn", _batches(2, 4, 12))
    _compare(plain, ckpt)
    assert int(ckpt["state"]["layer2.0.bn1.num_batches_tracked"]) == STEPS * MICRO_BATCHES


def test_unguarded_torch_checkpoint_double_counts() -> None:
    """The failure the guard prevents, shown on torch's BatchNorm: so the comparisons above can fail."""
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(3).double()
    x = torch.randn(4, 3, 5, 5, dtype=torch.float64, requires_grad=True)
    checkpoint(bn, x, use_reentrant=False).sum().backward()
    assert int(bn.num_batches_tracked) == 2


def test_timm_model_uses_its_own_checkpointing() -> None:
    pytest.importorskip("timm")
    cfg = {"name": "timm", "arch": "resnet10t"}
    plain, ckpt = _two_runs(cfg, "syncbn", _batches(4, 4, 16))
    _compare(plain, ckpt)


def test_layer_applied_twice_in_a_region_is_refused() -> None:
    bn = SyncBatchNorm2d(3).double()
    x = torch.randn(4, 3, 5, 5, dtype=torch.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match="cannot tell which forward"):
        checkpoint(lambda t: bn(bn(t)), x, use_reentrant=False).sum().backward()


def test_unknown_stages_are_a_config_error() -> None:
    model = nn.Sequential(nn.Conv2d(3, 3, 1), nn.BatchNorm2d(3))
    with pytest.raises(ValueError, match="trainer.activation_checkpointing"):
        enable_activation_checkpointing(model, model_family("torchvision"))
