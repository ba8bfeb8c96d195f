"""A model built with norm=syncbn before any process group exists synchronises over WORLD once one does.

Two real gloo processes each run half of a batch through a DeepLabV3+ (every norm position: backbone,
ASPP incl. its 1x1 pooling branch, decoder, aux head) and must match one process running the whole
batch with norm=bn: outputs, running statistics and (summed over ranks, PyTorch's convention for the
affine gradients, which DDP then averages) gradients.
"""
from __future__ import annotations

import pytest
import torch

from src.models import build_model

pytest.importorskip("src.syncbn")
from tests.support.gloo import run_on_ranks  # noqa: E402  (the project's gloo harness)

CFG = {"name": "deeplabv3plus_resnet18", "output_stride": 16, "aux_loss_weight": 0.5, "head_channels": 16}


def _rank_step(rank: int, world: int, payload: dict) -> dict:
    model, x = payload["model"], payload["x"].chunk(world)[rank]
    out = model(x)
    (out["out"].sum() + out["aux"].sum()).backward()
    return {"out": out["out"].detach(), "grads": {n: p.grad for n, p in model.named_parameters()},
            "buffers": dict(model.named_buffers())}


@pytest.mark.slow
def test_syncbn_deeplab_on_two_processes_matches_bn_on_one() -> None:
    torch.manual_seed(0)
    sync = build_model(CFG, {"name": "syncbn"}, 3).double()  # no process group yet: resolved at forward
    bn = build_model(CFG, {"name": "bn"}, 3).double()
    bn.load_state_dict(sync.state_dict())
    x = torch.randn(4, 3, 32, 32, dtype=torch.float64)
    sync.eval()(x[:1])  # loads (building if needed) the kernel extension here, so the children import it
    for model in (sync, bn):  # norms in training mode, dropout (ASPP, FCN head) off: no randomness
        model.train()
        for m in model.modules():
            if isinstance(m, torch.nn.Dropout):
                m.eval()
    ranks = run_on_ranks(2, _rank_step, {"model": sync, "x": x})
    out = bn(x)
    (out["out"].sum() + out["aux"].sum()).backward()
    # float64 everywhere; only reduction orders differ between the two paths.
    torch.testing.assert_close(torch.cat([r["out"] for r in ranks]), out["out"].detach(), rtol=1e-8, atol=1e-8)
    for name, p in bn.named_parameters():
        summed = ranks[0]["grads"][name] + ranks[1]["grads"][name]
        torch.testing.assert_close(summed, p.grad, rtol=1e-6, atol=1e-8, msg=name)
    for name, b in bn.named_buffers():
        for r in ranks:
            torch.testing.assert_close(r["buffers"][name], b, rtol=1e-8, atol=1e-8, msg=name)
