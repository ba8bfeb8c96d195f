"""model=timm / model=torchvision: built by name, with the configured norm, heads, weights files and options."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from timm.layers import BatchNormAct2d, GroupNormAct
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from src.models import FrozenBatchNorm2d, FrozenBatchNormAct2d, build_model, param_groups
from src.tasks import model_tasks
from src.syncbn import SyncBatchNorm2d, SyncBatchNormAct2d

# Small architectures of both zoos, with the norm layer kinds they are built from and their head module.
CASES = [
    ("timm", "mobilenetv3_small_050", "classifier"),  # BatchNormAct2d throughout
    ("timm", "regnety_002", "head.fc"),  # BatchNormAct2d + squeeze-excite
    ("timm", "resnet10t", "fc"),  # plain BatchNorm2d
    ("torchvision", "mobilenet_v3_small", "classifier.3"),
    ("torchvision", "squeezenet1_1", "classifier.1"),  # no BatchNorm at all; a conv classifier
    ("torchvision", "regnet_x_400mf", "fc"),
]
NUM_CLASSES = 5


def build(family: str, arch: str, norm: str = "bn", **model: object) -> nn.Module:
    torch.manual_seed(0)
    return build_model({"name": family, "arch": arch, **model}, {"name": norm, "num_groups": 8}, NUM_CLASSES)


def norm_kinds(model: nn.Module) -> set[type]:
    return {type(m) for m in model.modules()
            if isinstance(m, (_BatchNorm, nn.GroupNorm, FrozenBatchNorm2d))}


@pytest.mark.parametrize(("family", "arch", "head"), CASES, ids=[f"{f}-{a}" for f, a, _ in CASES])
def test_every_norm_everywhere_and_keys_move_between_them(family: str, arch: str, head: str) -> None:
    assert "classification" in model_tasks(family)
    expected = {
        "bn": {BatchNormAct2d, nn.BatchNorm2d}, "syncbn": {SyncBatchNormAct2d, SyncBatchNorm2d},
        "frozen_bn": {FrozenBatchNormAct2d, FrozenBatchNorm2d}, "gn": {GroupNormAct, nn.GroupNorm},
    }
    built = {}
    for norm, allowed in expected.items():
        model = build(family, arch, norm)
        assert norm_kinds(model) <= allowed, f"{norm}: stray norm layers {norm_kinds(model) - allowed}"
        assert model.head_module_names == (head,)
        out = model.eval()(torch.randn(2, 3, 32, 32))
        assert out.shape == (2, NUM_CLASSES)
        built[norm] = model
    keys = list(built["bn"].state_dict())
    for norm in ("syncbn", "frozen_bn"):  # checkpoints load strictly across bn / syncbn / frozen_bn
        assert list(built[norm].state_dict()) == keys
        built[norm].load_state_dict(built["bn"].state_dict(), strict=True)
    # The head group of the optimizer is exactly the classifier's parameters.
    groups = {g["name"]: g for g in param_groups(built["bn"], head_lr_mult=10.0)}
    head_params = set(built["bn"].get_submodule(head).parameters())
    assert set(groups["head"]["params"]) == head_params and groups["head"]["lr_mult"] == 10.0


@pytest.mark.parametrize(("family", "arch"), [("timm", "efficientnet_b0"), ("torchvision", "efficientnet_b0")])
def test_syncbn_model_in_channels_last_computes_what_bn_does(family: str, arch: str) -> None:
    """One process, training mode, float64: syncbn (plain batch norm here) with activations kept == bn."""
    bn = build(family, arch, "bn").double()
    sync = build(family, arch, "syncbn").double()
    sync.load_state_dict(bn.state_dict())
    x = torch.randn(4, 3, 32, 32, dtype=torch.float64)
    torch.manual_seed(1)  # the same dropout / stochastic-depth draws in both (batch norm draws none)
    expected = bn.train()(x)
    sync = sync.to(memory_format=torch.channels_last).train()
    torch.manual_seed(1)
    got = sync(x.contiguous(memory_format=torch.channels_last))
    # float64 end to end; the kernels' reduction order differs from ATen's: ~1e-15 relative per layer.
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)
    for (name, a), b in zip(bn.named_buffers(), sync.buffers()):
        torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-12, msg=name)


def test_frozen_bn_keeps_statistics_and_activation() -> None:
    model = build("timm", "mobilenetv3_small_050", "frozen_bn").train()
    layers = [m for m in model.modules() if isinstance(m, FrozenBatchNormAct2d)]
    assert layers and any(not isinstance(m.act, nn.Identity) for m in layers)
    before = {k: v.clone() for k, v in model.state_dict().items() if "running" in k}
    model(torch.randn(3, 3, 32, 32)).sum().backward()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items() if k in before)
    assert all(m.weight.grad is not None for m in layers)  # affine still trains


def test_weights_files_pth_and_safetensors(tmp_path: Path) -> None:
    source = build("timm", "regnety_002")
    state = {k: v.contiguous() for k, v in source.state_dict().items()}
    torch.save(state, tmp_path / "w.pth")
    save_file(state, str(tmp_path / "model.safetensors"))
    for name in ("w.pth", "model.safetensors"):
        torch.manual_seed(1)  # other random init: the file must overwrite every tensor
        model = build_model({"name": "timm", "arch": "regnety_002", "weights": str(tmp_path / name)},
                            {"name": "syncbn"}, NUM_CLASSES)
        assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    # Fine-tuning with another number of classes: everything but the head comes from the file.
    model = build_model({"name": "timm", "arch": "regnety_002", "backbone_weights": str(tmp_path / "w.pth")},
                        {"name": "bn"}, 3)
    got = model.state_dict()
    assert got["head.fc.weight"].shape == (3, 368)
    assert all(torch.equal(state[k], got[k]) for k in got if not k.startswith("head.fc."))


def test_zero_init_residual_maps_to_each_zoo_or_fails_clearly() -> None:
    timm_resnet = build("timm", "resnet10t", zero_init_residual=True)
    assert all(torch.count_nonzero(b.bn2.weight) == 0 for b in timm_resnet.modules() if hasattr(b, "bn2"))
    tv_resnet = build("torchvision", "resnet18", zero_init_residual=True)
    assert all(torch.count_nonzero(b.bn2.weight) == 0 for b in tv_resnet.modules() if hasattr(b, "bn2"))
    with pytest.raises(ValueError, match="timm.create_model rejected the options .'zero_init_last'."):
        build("timm", "mobilenetv3_small_050", zero_init_residual=True)
    with pytest.raises(ValueError, match="torchvision's mobilenet_v3_small has no such option"):
        build("torchvision", "mobilenet_v3_small", zero_init_residual=True)


def test_kwargs_reach_the_zoo_and_trainer_friendly_defaults() -> None:
    model = build("timm", "resnet10t", kwargs={"drop_rate": 0.25})
    assert model.drop_rate == 0.25
    googlenet = build("torchvision", "googlenet")  # aux_logits off: training returns logits, not a tuple
    assert googlenet.train()(torch.randn(2, 3, 64, 64)).shape == (2, NUM_CLASSES)


def test_group_norm_error_names_layers_and_a_fitting_count() -> None:
    with pytest.raises(ValueError, match=r"norm.num_groups=16 does not divide the channels of .* norm layer\(s\) of "
                                         r"this model: .*\(8 channels\).*; norm.num_groups=8 divides every one"):
        build_model({"name": "timm", "arch": "mobilenetv3_small_050"}, {"name": "gn", "num_groups": 16}, 3)


def test_missing_timm_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "timm", None)  # `import timm` now raises ImportError
    with pytest.raises(ImportError, match=r"model=timm needs the timm package.*pip install 'timm>=1.0,<2'"):
        build_model({"name": "timm", "arch": "resnet18"}, {"name": "bn"}, 3)
    build_model({"name": "torchvision", "arch": "resnet18"}, {"name": "syncbn"}, 3)  # the rest works without it
