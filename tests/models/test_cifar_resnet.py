"""CIFAR ResNets: the paper's parameter counts, shortcut options, zero-init, identical init from a seed."""
from __future__ import annotations

import pytest
import torch

from src.models import build_model
from src.models.cifar_resnet import CifarBasicBlock, PadShortcut


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# He et al. 2016, Table 6: 0.27M / 0.85M / 1.7M. The exact option-A counts (10 classes) are the
# widely reproduced ones (e.g. akamaster/pytorch_resnet_cifar10): 269,722 / 853,018 / 1,727,962.
@pytest.mark.parametrize(("name", "exact", "paper"), [
    ("resnet20", 269_722, 0.27e6), ("resnet56", 853_018, 0.85e6), ("resnet110", 1_727_962, 1.7e6)])
def test_parameter_counts_match_the_paper(name: str, exact: int, paper: float) -> None:
    count = n_params(build_model({"name": name}, {}, 10))
    assert count == exact
    assert round(count / 1e6, 2 if paper < 1e6 else 1) == pytest.approx(paper / 1e6)


def test_option_a_has_no_shortcut_parameters_option_b_has_projections() -> None:
    a = build_model({"name": "resnet20", "cifar_shortcut": "A"}, {}, 10)
    b = build_model({"name": "resnet20", "cifar_shortcut": "B"}, {}, 10)
    assert sum(isinstance(m, PadShortcut) for m in a.modules()) == 2  # stage 2 and 3 entries
    # B: two 1x1 convs (16->32, 32->64) with a norm each: 16*32 + 32*64 weights + 2*(32+64) affine.
    assert n_params(b) - n_params(a) == 16 * 32 + 32 * 64 + 2 * (32 + 64)
    x = torch.randn(2, 3, 32, 32)
    assert a(x).shape == b(x).shape == (2, 10)


def test_pad_shortcut_subsamples_and_zero_pads() -> None:
    x = torch.randn(2, 16, 8, 8)
    y = PadShortcut(16, 32, 2)(x)
    assert y.shape == (2, 32, 4, 4)
    assert torch.equal(y[:, :16], x[:, :, ::2, ::2]) and not y[:, 16:].any()


def test_zero_init_residual_starts_blocks_as_identity() -> None:
    model = build_model({"name": "resnet20", "zero_init_residual": True}, {}, 10)
    blocks = [m for m in model.modules() if isinstance(m, CifarBasicBlock)]
    assert len(blocks) == 9 and all(not b.bn2.weight.any() for b in blocks)
    default = build_model({"name": "resnet20"}, {}, 10)
    assert all(b.bn2.weight.eq(1).all() for b in default.modules() if isinstance(b, CifarBasicBlock))


def test_same_seed_same_weights() -> None:
    assert_same_seed_same_weights({"name": "resnet20"})


def assert_same_seed_same_weights(cfg: dict) -> None:
    """What every rank relies on: initialisation uses only torch's global RNG (also for a task's own models)."""
    states = []
    for seed in (3, 3, 4):
        torch.manual_seed(seed)
        states.append(build_model(cfg, {}, 5).state_dict())
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    assert not all(torch.equal(states[0][k], states[2][k]) for k in states[0])
