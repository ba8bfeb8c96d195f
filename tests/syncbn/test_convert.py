"""convert_sync_batchnorm / revert_sync_batchnorm keep the very same tensors, flags and state_dict."""
from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import timm
import torch
import torch.nn as nn
from timm.layers import BatchNormAct2d, SplitBatchNorm2d, SyncBatchNormAct
from timm.layers import convert_sync_batchnorm as timm_convert_sync_batchnorm

from src.syncbn import (
    SyncBatchNorm, SyncBatchNorm1d, SyncBatchNorm2d, SyncBatchNorm3d, SyncBatchNormAct2d, UnconvertedBatchNormWarning,
    convert_sync_batchnorm, revert_sync_batchnorm,
)

pytestmark = pytest.mark.usefixtures("restores_rng")  # tests here seed torch's global generator

REPO = Path(__file__).resolve().parents[2]


class CustomBN(nn.BatchNorm2d):
    """A user subclass with its own forward: must not be swapped for a layer that drops that forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 2


def _model() -> nn.Module:
    m = nn.Sequential(
        nn.Conv2d(3, 4, 3),
        nn.BatchNorm2d(4, momentum=None, eps=1e-3),
        CustomBN(4),
        nn.Sequential(nn.Flatten(2), nn.BatchNorm1d(4, affine=False), nn.Unflatten(2, (1, -1))),
        nn.Unflatten(2, (1, 1)),  # (N, 4, 1, 1, 9)
        nn.BatchNorm3d(4, track_running_stats=False, bias=False),
        nn.SyncBatchNorm(4),
    )
    m(torch.randn(3, 3, 5, 5))  # non-trivial running stats
    m[1].weight.requires_grad_(False)
    m[1].qconfig = "marker"
    m[3][1].eval()
    return m


def _snapshot(m: nn.Module) -> dict:
    return {
        "params": {n: p for n, p in m.named_parameters()},
        "buffers": {n: b for n, b in m.named_buffers()},
        "state": {k: v.clone() for k, v in m.state_dict().items()},
        "training": {n: x.training for n, x in m.named_modules()},
        "requires_grad": {n: p.requires_grad for n, p in m.named_parameters()},
    }


def _assert_same(before: dict, after: dict) -> None:
    assert before["params"].keys() == after["params"].keys()
    assert all(before["params"][n] is after["params"][n] for n in before["params"])  # same objects
    assert before["buffers"].keys() == after["buffers"].keys()
    assert all(before["buffers"][n] is after["buffers"][n] for n in before["buffers"])
    assert before["state"].keys() == after["state"].keys()
    assert all(torch.equal(before["state"][k], after["state"][k]) for k in before["state"])
    assert before["training"] == after["training"]
    assert before["requires_grad"] == after["requires_grad"]


def test_convert_then_revert_keeps_everything() -> None:
    model = _model()
    plain = _snapshot(model)
    group_marker = object()  # stands for a process group; only stored at conversion time
    with pytest.warns(UnconvertedBatchNormWarning, match=r"1 BatchNorm subclass layer\(s\).*: 2 \(.*CustomBN\)"):
        synced = convert_sync_batchnorm(model, process_group=group_marker)
    assert synced is model
    assert [type(m) for m in synced.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)] == [
        SyncBatchNorm2d, CustomBN, SyncBatchNorm1d, SyncBatchNorm3d, SyncBatchNorm,
    ]
    assert synced[1].qconfig == "marker" and synced[1].momentum is None and synced[1].eps == 1e-3
    assert synced[5].bias is None and not synced[5].track_running_stats and synced[3][1].weight is None
    assert all(m.process_group is group_marker for m in synced.modules() if isinstance(m, SyncBatchNorm))
    _assert_same(plain, _snapshot(synced))

    reverted = revert_sync_batchnorm(synced)
    assert [type(m) for m in reverted.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)] == [
        nn.BatchNorm2d, CustomBN, nn.BatchNorm1d, nn.BatchNorm3d, nn.SyncBatchNorm,
    ]
    assert reverted[1].qconfig == "marker"
    _assert_same(plain, _snapshot(reverted))


def test_root_batchnorm_returns_new_layer() -> None:
    bn = nn.BatchNorm2d(3).eval()
    synced = convert_sync_batchnorm(bn)
    assert type(synced) is SyncBatchNorm2d and synced.weight is bn.weight and not synced.training
    assert synced.running_mean is bn.running_mean and synced.process_group is None
    back = revert_sync_batchnorm(synced)
    assert type(back) is nn.BatchNorm2d and back.weight is bn.weight and not back.training


def test_converted_model_computes_the_same() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.BatchNorm1d(36))
    ref = nn.Sequential(*[m for m in model])  # the same layers, before conversion
    x = torch.randn(5, 3, 5, 5)
    expected = ref.eval()(x)
    synced = convert_sync_batchnorm(model).eval()
    torch.testing.assert_close(synced(x), expected)


def test_lazy_and_double_models() -> None:
    lazy = nn.Sequential(nn.LazyBatchNorm2d())
    with pytest.warns(UnconvertedBatchNormWarning, match=r"0 \(torch.nn.modules.batchnorm.LazyBatchNorm2d\)"):
        assert type(convert_sync_batchnorm(lazy)[0]) is nn.LazyBatchNorm2d  # nothing to keep yet: untouched
    lazy(torch.randn(2, 3, 4, 4))  # now it has become an nn.BatchNorm2d
    assert type(convert_sync_batchnorm(lazy)[0]) is SyncBatchNorm2d
    double = convert_sync_batchnorm(nn.BatchNorm1d(3, dtype=torch.float64))
    assert double.weight.dtype == double.running_var.dtype == torch.float64


def test_already_synced_layers_only_change_group() -> None:
    layer = SyncBatchNorm2d(3)
    marker = object()
    assert convert_sync_batchnorm(layer) is layer and layer.process_group is None
    assert convert_sync_batchnorm(layer, marker) is layer and layer.process_group is marker


def _norm_act_model() -> nn.Module:
    """timm norm+act layers with an activation that has a parameter (PReLU) and a drop layer."""
    m = nn.Sequential(
        nn.Conv2d(3, 4, 3),
        BatchNormAct2d(4, act_layer=nn.PReLU, act_kwargs={"num_parameters": 4}, inplace=None,
                       drop_layer=lambda: nn.Dropout(0.0)),
        BatchNormAct2d(4, momentum=None, eps=1e-3, act_layer=nn.SiLU),
        BatchNormAct2d(4, apply_act=False, affine=False),
    )
    m(torch.randn(3, 3, 5, 5))  # non-trivial running stats
    m[2].qconfig = "marker"
    m[3].eval()
    return m


def test_timm_norm_act_layers_keep_act_drop_tensors_and_keys() -> None:
    model = _norm_act_model()
    plain = _snapshot(model)
    acts = [model[i].act for i in (1, 2, 3)]
    drop = model[1].drop
    x = torch.randn(2, 3, 5, 5)
    expected = model.eval()(x)
    model.train()
    model[3].eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing left unconverted, so no warning
        synced = convert_sync_batchnorm(model)
    assert [type(m) for m in synced[1:]] == [SyncBatchNormAct2d] * 3
    assert [synced[i].act for i in (1, 2, 3)] == acts and synced[1].drop is drop
    assert synced[2].qconfig == "marker" and synced[2].momentum is None and synced[2].eps == 1e-3
    assert "1.act.weight" in plain["params"]  # PReLU's own parameter stays under the same key
    _assert_same(plain, _snapshot(synced))
    torch.testing.assert_close(synced.eval()(x), expected)  # one process, eval: same function

    synced.train()
    synced[3].eval()
    reverted = revert_sync_batchnorm(synced)
    assert [type(m) for m in reverted[1:]] == [BatchNormAct2d] * 3
    assert [reverted[i].act for i in (1, 2, 3)] == acts and reverted[1].drop is drop
    _assert_same(plain, _snapshot(reverted))
    torch.testing.assert_close(reverted.eval()(x), expected)


def test_timm_sync_batchnorm_act_converts_to_ours() -> None:
    """timm's own converter makes SyncBatchNormAct (an nn.SyncBatchNorm); ours takes it over, act included."""
    model = timm_convert_sync_batchnorm(_norm_act_model())
    assert type(model[1]) is SyncBatchNormAct
    acts = [model[i].act for i in (1, 2, 3)]
    synced = convert_sync_batchnorm(model)
    assert [type(m) for m in synced[1:]] == [SyncBatchNormAct2d] * 3
    assert [synced[i].act for i in (1, 2, 3)] == acts


@pytest.mark.parametrize("arch", ["efficientnet_b0", "mobilenetv3_small_100", "regnety_002"])
def test_real_timm_models_convert_completely(arch: str) -> None:
    model = timm.create_model(arch, pretrained=False, num_classes=7)
    keys = list(model.state_dict())
    count = sum(isinstance(m, BatchNormAct2d) for m in model.modules())
    assert count > 10
    x = torch.randn(2, 3, 32, 32)
    expected = model.eval()(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        synced = convert_sync_batchnorm(model.train())
    assert not any(isinstance(m, BatchNormAct2d) for m in synced.modules())
    assert sum(type(m) is SyncBatchNormAct2d for m in synced.modules()) == count
    assert list(synced.state_dict()) == keys
    torch.testing.assert_close(synced.eval()(x), expected, rtol=0, atol=0)  # eval = F.batch_norm: same ops


def test_unknown_subclasses_are_named_and_strict_raises() -> None:
    model = nn.Sequential(nn.BatchNorm2d(4), nn.Sequential(CustomBN(4), SplitBatchNorm2d(4, num_splits=2)))
    with pytest.raises(TypeError, match=r"2 BatchNorm subclass layer\(s\).*1.0 \(.*CustomBN\), "
                                        r"1.1 \(timm.layers.split_batchnorm.SplitBatchNorm2d\).*strict=True"):
        convert_sync_batchnorm(model, strict=True)
    assert type(model[0]) is nn.BatchNorm2d  # strict: nothing converted
    with pytest.warns(UnconvertedBatchNormWarning) as record:
        synced = convert_sync_batchnorm(model)
    assert len(record) == 1  # one warning for the whole model, naming both
    assert type(synced[0]) is SyncBatchNorm2d
    assert [type(m) for m in synced[1]] == [CustomBN, SplitBatchNorm2d]


def test_converting_never_imports_timm() -> None:
    code = ("import sys, torchvision; from src.syncbn import convert_sync_batchnorm, revert_sync_batchnorm; "
            "m = revert_sync_batchnorm(convert_sync_batchnorm(torchvision.models.resnet18())); "
            "assert 'timm' not in sys.modules, 'timm imported'; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
