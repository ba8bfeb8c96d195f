"""build_optimizer's fused kernels: used where torch has them, the same maths as the default, clear errors."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from src.config import OptimConfig
from src.engine.optim import build_optimizer

pytestmark = pytest.mark.usefixtures("restores_rng")  # tests here seed torch's global generator


class _Net(nn.Module):
    """Conv + BN trunk and an `fc` head: decayed, undecayed (BN, biases) and head (head_lr_mult) groups."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten())
        self.fc = nn.Linear(8 * 4 * 4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return _Net()


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int = 5) -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(4, 3, 6, 6, generator=g), torch.randint(0, 4, (4,), generator=g)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_fused_by_default_on_cpu(name: str) -> None:
    optimizer = build_optimizer(_model(), OptimConfig(name=name), effective_batch=4)
    assert optimizer.defaults["fused"] is True


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_fused_false_uses_torch_default(name: str) -> None:
    optimizer = build_optimizer(_model(), OptimConfig(name=name, fused=False), effective_batch=4)
    assert not optimizer.defaults["fused"]


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_fused_matches_default_implementation(name: str) -> None:
    """Same updates with both implementations, through weight decay, no-decay groups and momentum.

    Tolerance 1e-6 (float32): the kernels order the same operations differently, so a few ulps per
    step differ over 5 steps; a wrong hyper-parameter (lr, decay, betas) would differ by > 1e-3.
    """
    cfg = OptimConfig(name=name, lr=0.05, weight_decay=0.01, head_lr_mult=2.0)
    fused_model = _model()
    loop_model = copy.deepcopy(fused_model)
    _train(fused_model, build_optimizer(fused_model, cfg, effective_batch=4))
    _train(loop_model, build_optimizer(loop_model, OptimConfig(**{**vars(cfg), "fused": False}), 4))
    for (key, a), b in zip(fused_model.state_dict().items(), loop_model.state_dict().values()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6, msg=key)
    assert not torch.equal(fused_model.features[0].weight, _model().features[0].weight)  # it did train


def test_unsupported_parameters_fall_back_or_fail_clearly() -> None:
    model = nn.Linear(3, 2)
    model.phase = nn.Parameter(torch.zeros(2, dtype=torch.complex64))  # fused kernels take real floats only
    assert not build_optimizer(model, OptimConfig(name="adamw"), effective_batch=4).defaults["fused"]
    with pytest.raises(ValueError, match=r"optim.fused=true: the fused AdamW .* has torch.complex64 on cpu"):
        build_optimizer(model, OptimConfig(name="adamw", fused=True), effective_batch=4)


@pytest.mark.parametrize("reference, effective, lr, how", [
    (128, 64, 0.05, "lr 0.05 = optim.lr 0.1 for optim.reference_batch_size=128 images, at an effective batch of 64 "
                    "(scaled linearly by 64/128)"),
    (None, 64, 0.1, "lr 0.1 = optim.lr, not scaled with the effective batch of 64 (optim.reference_batch_size is "
                    "null)"),
], ids=["scaled", "as_given"])
def test_the_lr_used_and_how_it_was_scaled_are_logged(caplog: pytest.LogCaptureFixture, reference: int | None,
                                                      effective: int, lr: float, how: str) -> None:
    with caplog.at_level("INFO", logger="src.engine.optim"):
        optimizer = build_optimizer(_model(), OptimConfig(lr=0.1, reference_batch_size=reference), effective)
    assert [group["lr"] for group in optimizer.param_groups] == pytest.approx([lr] * len(optimizer.param_groups))
    assert [r.getMessage() for r in caplog.records] == [how]
