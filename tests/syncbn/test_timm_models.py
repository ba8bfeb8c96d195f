"""Real timm models converted by convert_sync_batchnorm, on 2 gloo processes with 3 + 5 images, in float64,
against one process running the unconverted model (timm's BatchNormAct2d, i.e. nn.BatchNorm) on all 8.

Compared: outputs, input grads, the sum over ranks of every parameter grad (each rank's are its local
contributions, which DDP would average), and every running statistic. Without the norm+act conversion
these models keep per-rank BatchNormAct2d layers and their outputs differ from the reference by 20-110%.
"""
from __future__ import annotations

from typing import Any

import pytest
import timm
import torch

from src.syncbn import SyncBatchNormAct2d, convert_sync_batchnorm
from tests.support.gloo import run_on_ranks

pytestmark = pytest.mark.usefixtures("restores_rng")  # tests here seed torch's global generator

ARCHS = ("efficientnet_b0", "mobilenetv3_small_100", "regnety_002")
BATCHES = (3, 5)
SIZE = 32
NUM_CLASSES = 4
# float64 end to end; only summation order differs (our kernels' Chan merge of two ranks vs ATen's one
# pass), ~1e-15 relative per layer, compounding over 50 layers to well under 1e-9.
TOL = 1e-9


def _model(arch: str) -> torch.nn.Module:
    torch.manual_seed(0)  # same initial weights in the parent and in both children
    # No dropout / drop-path: the reference and the ranks must compute the same function.
    return timm.create_model(arch, pretrained=False, num_classes=NUM_CLASSES, drop_rate=0.0,
                             drop_path_rate=0.0).double().train()


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(sum(BATCHES), 3, SIZE, SIZE, generator=gen, dtype=torch.float64)
    g = torch.randn(sum(BATCHES), NUM_CLASSES, generator=gen, dtype=torch.float64)
    return x, g


def _step(model: torch.nn.Module, x: torch.Tensor, g: torch.Tensor) -> dict[str, Any]:
    x = x.clone().requires_grad_()
    y = model(x)
    (y * g).sum().backward()
    return {"y": y.detach(), "dx": x.grad, "grads": {n: p.grad.clone() for n, p in model.named_parameters()},
            "buffers": {n: b.clone() for n, b in model.named_buffers()}}


def _child(rank: int, world: int, payload: dict) -> dict[str, Any]:
    x, g = _data()
    rows = slice(sum(BATCHES[:rank]), sum(BATCHES[:rank + 1]))
    out = {}
    for arch in ARCHS:
        model = convert_sync_batchnorm(_model(arch))
        converted = sum(type(m) is SyncBatchNormAct2d for m in model.modules())
        out[arch] = {**_step(model, x[rows], g[rows]), "converted": converted}
    return out


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return run_on_ranks(2, _child, {})


@pytest.mark.parametrize("arch", ARCHS)
def test_converted_timm_model_equals_one_process_batchnorm(ranks: list[dict], arch: str) -> None:
    reference = _model(arch)
    layers = sum(type(m).__name__ == "BatchNormAct2d" for m in reference.modules())
    x, g = _data()
    exp = _step(reference, x, g)
    assert all(r[arch]["converted"] == layers > 10 for r in ranks)
    torch.testing.assert_close(torch.cat([r[arch]["y"] for r in ranks]), exp["y"], rtol=TOL, atol=TOL)
    torch.testing.assert_close(torch.cat([r[arch]["dx"] for r in ranks]), exp["dx"], rtol=TOL, atol=TOL)
    for name, grad in exp["grads"].items():
        total = ranks[0][arch]["grads"][name] + ranks[1][arch]["grads"][name]
        torch.testing.assert_close(total, grad, rtol=TOL, atol=TOL, msg=lambda m: f"grad of {name}: {m}")
    for name, buf in exp["buffers"].items():
        for r in ranks:
            torch.testing.assert_close(r[arch]["buffers"][name], buf, rtol=TOL, atol=TOL,
                                       msg=lambda m: f"buffer {name}: {m}")
