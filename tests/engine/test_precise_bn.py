"""Precise BatchNorm statistics (src/engine/precise_bn.py) on real gloo ranks against a one-process float64 oracle,
the state it must leave alone, and trainer.precise_bn_*'s config checks.

Two models (a second one stands for the EMA copy: other weights, the same batches), each a conv + BatchNorm2d and a
linear + BatchNorm1d, in float64. Rank r holds its own batches of unequal sizes, and the last rank one batch fewer
(it starts its batches again for the third forward): the oracle is the plain mean and unbiased variance of all
the inputs each layer saw, in training mode, over every rank.
"""
from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

from src.config import TrainerConfig, validate_config
from src.engine.precise_bn import recompute_bn_stats
from src.syncbn import convert_sync_batchnorm
from tests.support.gloo import run_on_ranks

pytestmark = pytest.mark.usefixtures("restores_rng")  # tests here seed torch's global generator

NUM_BATCHES = 3


def _model(seed: int, norm: str) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
                          nn.Flatten(), nn.Linear(16, 5), nn.BatchNorm1d(5)).double()
    for bn in (model[1], model[6]):  # statistics far from the population's, so an unchanged buffer fails
        bn.running_mean.fill_(3.0)
        bn.running_var.fill_(0.25)
        bn.num_batches_tracked.fill_(7)
    return convert_sync_batchnorm(model) if norm == "syncbn" else model


def _batches(rank: int, world: int) -> list[torch.Tensor]:
    """Rank r's batches: sizes 4, 2 + r, 3, the last rank without the third; inputs off-centre, not unit scale."""
    sizes = [4, 2 + rank, 3][:NUM_BATCHES if rank < world - 1 else NUM_BATCHES - 1]
    g = torch.Generator().manual_seed(100 * world + rank)
    return [2.0 + 3.0 * torch.randn(b, 3, 5, 5, generator=g, dtype=torch.float64) for b in sizes]


def _passes(rank: int, world: int) -> list[torch.Tensor]:
    """The NUM_BATCHES inputs rank `rank` forwards: its batches, started again when they run out."""
    mine = _batches(rank, world)
    return [mine[k % len(mine)] for k in range(NUM_BATCHES)]


def _stats(model: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(m.running_mean.clone(), m.running_var.clone()) for m in model.modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def recalibrate_on_rank(rank: int, world: int, norm: str) -> dict[str, Any]:
    models = [_model(0, norm), _model(1, norm)]
    models[0][5].eval()  # a module outside training mode must end there again
    for p in models[0].parameters():
        p.grad = torch.full_like(p, 0.5)  # left by an accumulation window: must survive untouched
    before = [copy.deepcopy(m.state_dict()) for m in models]
    flags = [[m.training for m in model.modules()] for model in models]
    recompute_bn_stats(models, _batches(rank, world), NUM_BATCHES)
    return {
        "stats": [_stats(m) for m in models],
        "flags_kept": flags == [[m.training for m in model.modules()] for model in models],
        "grads_kept": all(torch.equal(p.grad, torch.full_like(p, 0.5)) for p in models[0].parameters()),
        "others_kept": all(torch.equal(v, old[k]) for m, old in zip(models, before)
                           for k, v in m.state_dict().items() if not k.endswith(("running_mean", "running_var"))),
    }


def _oracle(seed: int, world: int, norm: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One process, plain nn.BatchNorm in training mode: syncbn normalises over the ranks' k-th batches together
    (their concatenation), bn over each rank's batch alone; each layer's inputs are kept and reduced at the end."""
    model = _model(seed, "bn").train()
    layers = [model[1], model[6]]
    seen: list[list[torch.Tensor]] = [[], []]
    for i, layer in enumerate(layers):
        layer.register_forward_pre_hook(lambda m, args, i=i: seen[i].append(args[0].detach().clone()))
    passes = [_passes(r, world) for r in range(world)]
    with torch.no_grad():
        for k in range(NUM_BATCHES):
            if norm == "syncbn":
                model(torch.cat([passes[r][k] for r in range(world)]))
            else:
                for r in range(world):
                    model(passes[r][k])
    out = []
    for inputs in seen:
        x = torch.cat(inputs).transpose(0, 1).reshape(inputs[0].shape[1], -1)  # (C, every value of the channel)
        out.append((x.mean(dim=1), x.var(dim=1, unbiased=True)))
    return out


@pytest.mark.parametrize("world,norm", [(2, "syncbn"), (3, "bn")])
def test_statistics_are_the_population_statistics_over_all_ranks_and_identical_on_each(world: int, norm: str) -> None:
    results = run_on_ranks(world, recalibrate_on_rank, norm)
    for r in results:
        assert r["flags_kept"] and r["grads_kept"] and r["others_kept"]
    for index, seed in enumerate((0, 1)):  # the model, then the "EMA" with its own weights
        expected = _oracle(seed, world, norm)
        got = results[0]["stats"][index]
        for (mean, var), (want_mean, want_var) in zip(got, expected):
            torch.testing.assert_close(mean, want_mean, rtol=0, atol=1e-12)
            torch.testing.assert_close(var, want_var, rtol=1e-12, atol=0)
            assert not torch.allclose(var, torch.full_like(var, 0.25))  # really recomputed
        for other in results[1:]:  # bit-identical on every rank
            assert all(torch.equal(a, b) for pair, other_pair in zip(got, other["stats"][index])
                       for a, b in zip(pair, other_pair))


@pytest.mark.parametrize("override,message", [
    ("trainer.precise_bn_batches=-1", r"trainer\.precise_bn_batches must be >= 0, got -1"),
    ("trainer.precise_bn_batches=2.5", r"trainer\.precise_bn_batches.*could not be converted to Integer"),
    ("trainer.precise_bn_every=-2", r"trainer\.precise_bn_every must be >= 0"),
    ("trainer.precise_bn_every=2", r"trainer\.precise_bn_every=2 needs trainer\.precise_bn_batches > 0"),
])
def test_bad_precise_bn_settings_name_the_key(override: str, message: str) -> None:
    key, value = override.split("=")
    group, name = key.split(".")
    with pytest.raises(ValueError, match=message):
        validate_config({group: {name: value}})


def test_precise_bn_refuses_norms_without_running_statistics() -> None:
    assert validate_config({"trainer": {"precise_bn_batches": 8, "precise_bn_every": 2}}).trainer.precise_bn_batches == 8
    with pytest.raises(ValueError, match=r"precise_bn_batches=8 with norm=gn: GroupNorm has no running statistics"):
        validate_config({"trainer": {"precise_bn_batches": 8}, "norm": {"name": "gn"}})
    with pytest.raises(ValueError, match=r"trainer\.precise_bn_batches must be a whole number >= 0, got 2\.0"):
        TrainerConfig(precise_bn_batches=2.0).validate()  # type: ignore[arg-type]
