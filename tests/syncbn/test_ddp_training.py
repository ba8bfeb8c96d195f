"""Several SGD steps of Conv -> SyncBN -> ReLU -> Linear under DDP on 2 processes equal one process
with nn.BatchNorm2d on the whole batch, parameter for parameter, at every step.

Gradient convention: DDP averages the ranks' grads, so rank r's loss is scaled to
sum(per-sample loss on r) * W / B (= the local mean when batches are equal); the average over ranks is
then the gradient of the one-process mean loss, including the cross-rank terms SyncBN's backward adds.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from src.syncbn import convert_sync_batchnorm
from tests.support.gloo import run_on_ranks

pytestmark = pytest.mark.usefixtures("restores_rng")  # tests here seed torch's global generator

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
STEPS = 4
# fp32 training compared with fp32 training: different summation orders (per-rank partial sums,
# gloo's all_reduce) give ~1e-7 relative differences per step; 4 SGD steps with lr 0.1 keep them < 1e-5.
TOL = dict(atol=2e-5, rtol=1e-4)


def _model(device: str) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(6, 4),
    ).to(device)


def _data(batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(3)
    return [(torch.randn(batch, 3, 6, 6, generator=gen) * 2 + 1, torch.randint(0, 4, (batch,), generator=gen))
            for _ in range(STEPS)]


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def run_ddp(rank: int, world: int, payload: dict) -> dict[str, list]:
    """Child: train the converted model under DDP for each split; state_dict after every step."""
    device = payload["device"]
    out: dict[str, list] = {}
    for name, sizes in payload["splits"].items():
        model = convert_sync_batchnorm(_model(device))
        ddp = DDP(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        start, stop = sum(sizes[:rank]), sum(sizes[: rank + 1])
        states = []
        for x, y in _data(sum(sizes)):
            x, y = x[start:stop].to(device), y[start:stop].to(device)
            loss = F.cross_entropy(ddp(x), y, reduction="sum") * world / sum(sizes)
            opt.zero_grad()
            loss.backward()
            opt.step()
            states.append(_snapshot(model))
        out[name] = states
    return out


def _reference(device: str, batch: int) -> list[dict[str, torch.Tensor]]:
    model = _model(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    states = []
    for x, y in _data(batch):
        loss = F.cross_entropy(model(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        states.append(_snapshot(model))
    return states


@pytest.mark.parametrize("device", DEVICES)
def test_ddp_training_matches_one_process(device: str) -> None:
    splits = {"equal": [4, 4], "uneven": [2, 5]}
    results = run_on_ranks(2, run_ddp, {"device": device, "splits": splits})
    for name, sizes in splits.items():
        ref = _reference(device, sum(sizes))
        for rank, res in enumerate(results):
            for step, (got, exp) in enumerate(zip(res[name], ref)):
                assert got.keys() == exp.keys()
                for key in exp:
                    torch.testing.assert_close(got[key], exp[key], **TOL,
                                               msg=lambda m: f"{name} split, rank {rank}, step {step}, {key}: {m}")
