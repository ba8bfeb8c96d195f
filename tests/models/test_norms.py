"""Each norm option ends up in every norm position; frozen_bn semantics; checkpoints move between norms."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from src.models import NORM_TYPES, FrozenBatchNorm2d, build_model, count_norm_layers

# Small configurations that still contain every kind of norm position: stems, blocks, projection shortcuts (a
# task's own models reuse these tests with its configurations: its test module imports them and sets model_cfg).
MODELS = [
    {"name": "resnet20", "cifar_shortcut": "B"},
    {"name": "resnet18"},
]


@pytest.fixture(params=MODELS, ids=lambda m: m["name"])
def model_cfg(request: pytest.FixtureRequest) -> dict:
    """Each model configuration of MODELS."""
    return request.param


def syncbn_types() -> tuple[type, ...]:
    syncbn = pytest.importorskip("src.syncbn")
    return (syncbn.SyncBatchNorm2d,)


def expected_type(norm: str) -> tuple[type, ...]:
    return {"bn": (nn.BatchNorm2d,), "torch_syncbn": (nn.SyncBatchNorm,), "gn": (nn.GroupNorm,),
            "frozen_bn": (FrozenBatchNorm2d,)}.get(norm) or syncbn_types()


@pytest.mark.parametrize("norm", ["syncbn", "torch_syncbn", "gn", "frozen_bn"])
def test_norm_placed_everywhere(model_cfg: dict, norm: str) -> None:
    reference = build_model(model_cfg, {"name": "bn"}, 3)
    positions = [name for name, m in reference.named_modules() if isinstance(m, NORM_TYPES)]
    assert positions and all(type(reference.get_submodule(p)) is nn.BatchNorm2d for p in positions)
    model = build_model(model_cfg, {"name": norm, "eps": 1e-3, "momentum": 0.2, "num_groups": 4}, 3)
    found = [name for name, m in model.named_modules() if isinstance(m, NORM_TYPES)]
    assert found == positions  # same places, nothing left over, nothing extra
    want = expected_type(norm)
    for name in found:
        layer = model.get_submodule(name)
        assert type(layer) in want, f"{name} is {type(layer).__name__}, expected {want}"
        assert layer.eps == 1e-3, name  # eps reaches torchvision's hard-coded head layers too
        if norm == "gn":
            assert layer.num_groups == 4
        elif norm != "frozen_bn":
            assert layer.momentum == 0.2, name
    assert sum(count_norm_layers(model).values()) == len(positions)


def test_bn_gets_eps_and_momentum_everywhere(model_cfg: dict) -> None:
    model = build_model(model_cfg, {"name": "bn", "eps": 1e-3, "momentum": None}, 3)
    layers = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert layers and all(m.eps == 1e-3 and m.momentum is None for m in layers)


def test_gn_rejects_a_group_count_that_does_not_divide() -> None:
    with pytest.raises(ValueError, match="norm.num_groups=32 does not divide a norm layer's 16 channels"):
        build_model({"name": "resnet20"}, {"name": "gn", "num_groups": 32}, 10)


def test_frozen_bn_statistics_never_change_and_affine_trains() -> None:
    torch.manual_seed(0)
    model = build_model({"name": "resnet20"}, {"name": "frozen_bn"}, 10)
    with torch.no_grad():  # non-trivial statistics, as after loading a pretrained file
        for m in model.modules():
            if isinstance(m, FrozenBatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 2.0)
    before = {k: v.clone() for k, v in model.state_dict().items() if "running" in k or "num_batches" in k}
    model.train()
    x = torch.randn(4, 3, 32, 32)
    out = model(x)
    out.square().mean().backward()
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    norms = [m for m in model.modules() if isinstance(m, FrozenBatchNorm2d)]
    assert all(m.weight.grad is not None and m.weight.grad.abs().sum() > 0 for m in norms)
    assert all(m.bias.grad is not None and m.bias.grad.abs().sum() > 0 for m in norms)
    # Training mode normalises exactly as eval mode does (global statistics).
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(x), out.detach(), rtol=0, atol=0)


def test_frozen_bn_is_bn_in_eval_mode_with_the_same_keys() -> None:
    bn = nn.BatchNorm2d(6).train()
    bn(torch.randn(8, 6, 4, 4) * 3 + 1)  # move the running statistics away from 0/1
    frozen = FrozenBatchNorm2d(6)
    assert list(frozen.state_dict()) == list(bn.state_dict())
    frozen.load_state_dict(bn.state_dict())  # strict
    x = torch.randn(2, 6, 5, 5)
    torch.testing.assert_close(frozen.train()(x), bn.eval()(x))
    legacy = {k: v for k, v in bn.state_dict().items() if k != "num_batches_tracked"}
    frozen.load_state_dict(legacy)  # pre-1.0 BatchNorm checkpoints lack num_batches_tracked
    with pytest.raises(ValueError, match="expects 4-D input"):
        frozen(torch.randn(2, 6))


@pytest.mark.parametrize("norm", ["bn", "frozen_bn", "gn", "syncbn"])
def test_affine_trainable_false_freezes_only_norm_parameters(norm: str) -> None:
    if norm == "syncbn":
        syncbn_types()
    model = build_model({"name": "resnet20"}, {"name": norm, "affine_trainable": False}, 10)
    for module in model.modules():
        for p in module.parameters(recurse=False):
            assert p.requires_grad == (not isinstance(module, NORM_TYPES))


def test_checkpoint_moves_between_bn_syncbn_frozen_bn(model_cfg: dict) -> None:
    syncbn_types()
    torch.manual_seed(1)
    bn = build_model(model_cfg, {"name": "bn"}, 3)
    with torch.no_grad():
        for m in bn.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_()
                m.num_batches_tracked.fill_(7)
    state = bn.state_dict()
    for norm in ("syncbn", "frozen_bn", "bn"):
        torch.manual_seed(2)  # different initial weights: everything must come from the state_dict
        other = build_model(model_cfg, {"name": norm}, 3)
        other.load_state_dict(state)  # strict
        assert list(other.state_dict()) == list(state)
        assert all(torch.equal(v, state[k]) for k, v in other.state_dict().items())
        state = other.state_dict()  # bn -> syncbn -> frozen_bn -> bn


def test_syncbn_model_runs_in_one_process_like_bn() -> None:
    """Without a process group our SyncBN is plain BatchNorm (the contract in docs/syncbn.md)."""
    syncbn_types()
    torch.manual_seed(0)
    bn = build_model({"name": "resnet20"}, {"name": "bn"}, 10).double()
    sync = build_model({"name": "resnet20"}, {"name": "syncbn"}, 10).double()
    sync.load_state_dict(bn.state_dict())
    x = torch.randn(4, 3, 32, 32, dtype=torch.float64)
    out_bn, out_sync = bn(x), sync(x)
    out_bn.sum().backward()
    out_sync.sum().backward()
    # float64 on both sides; only the reduction order differs.
    torch.testing.assert_close(out_sync, out_bn, rtol=1e-9, atol=1e-9)
    for (name, p), q in zip(bn.named_parameters(), sync.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-7, atol=1e-9, msg=name)
    for (name, b), c in zip(bn.named_buffers(), sync.buffers()):
        torch.testing.assert_close(c, b, rtol=1e-9, atol=1e-9, msg=name)


def test_torch_syncbn_builds_and_runs_in_eval_on_cpu() -> None:
    """torch_syncbn is refused for training on CPU by NormConfig.validate, but the model can be built."""
    model = build_model({"name": "resnet20"}, {"name": "torch_syncbn"}, 10).eval()
    assert count_norm_layers(model) == {"SyncBatchNorm": 19}
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
