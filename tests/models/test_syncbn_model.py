"""A model built with norm=syncbn before any process group exists synchronises over WORLD once one does.

Two real gloo processes each run half of a batch through the model and must match one process running the whole
batch with norm=bn: outputs, running statistics and (summed over ranks, PyTorch's convention for the affine
gradients, which DDP then averages) gradients. Here a CIFAR ResNet-20 with projection shortcuts (norms in the
stem, every block and the shortcuts); a task's own models run the same test with their configuration (its test
module imports it and sets syncbn_model_cfg, e.g. DeepLabV3+ with every norm position of ASPP, decoder, aux head).
"""
from __future__ import annotations

import pytest
import torch

from src.models import build_model

pytest.importorskip("src.syncbn")
from tests.support.gloo import run_on_ranks  # noqa: E402  (the project's gloo harness)


@pytest.fixture
def syncbn_model_cfg() -> dict:
    """The model configuration the test runs (a task's test module overrides it)."""
    return {"name": "resnet20", "cifar_shortcut": "B"}


def outputs(out: torch.Tensor | dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """A model's output tensors: the tensor itself, or each head's of a dict (a segmenter's "out" and "aux")."""
    return list(out.values()) if isinstance(out, dict) else [out]


def _rank_step(rank: int, world: int, payload: dict) -> dict:
    model, x = payload["model"], payload["x"].chunk(world)[rank]
    out = outputs(model(x))
    sum(o.sum() for o in out).backward()
    return {"out": [o.detach() for o in out], "grads": {n: p.grad for n, p in model.named_parameters()},
            "buffers": dict(model.named_buffers())}


@pytest.mark.slow
def test_syncbn_model_on_two_processes_matches_bn_on_one(syncbn_model_cfg: dict) -> None:
    torch.manual_seed(0)
    sync = build_model(syncbn_model_cfg, {"name": "syncbn"}, 3).double()  # no process group yet: resolved at forward
    bn = build_model(syncbn_model_cfg, {"name": "bn"}, 3).double()
    bn.load_state_dict(sync.state_dict())
    x = torch.randn(4, 3, 32, 32, dtype=torch.float64)
    sync.eval()(x[:1])  # loads (building if needed) the kernel extension here, so the children import it
    for model in (sync, bn):  # norms in training mode, dropout (e.g. ASPP, FCN head) off: no randomness
        model.train()
        for m in model.modules():
            if isinstance(m, torch.nn.Dropout):
                m.eval()
    ranks = run_on_ranks(2, _rank_step, {"model": sync, "x": x})
    out = outputs(bn(x))
    sum(o.sum() for o in out).backward()
    # float64 everywhere; only reduction orders differ between the two paths.
    for head, expected in enumerate(out):
        torch.testing.assert_close(torch.cat([r["out"][head] for r in ranks]), expected.detach(), rtol=1e-8,
                                   atol=1e-8)
    for name, p in bn.named_parameters():
        summed = ranks[0]["grads"][name] + ranks[1]["grads"][name]
        torch.testing.assert_close(summed, p.grad, rtol=1e-6, atol=1e-8, msg=name)
    for name, b in bn.named_buffers():
        for r in ranks:
            torch.testing.assert_close(r["buffers"][name], b, rtol=1e-8, atol=1e-8, msg=name)
