"""convert_sync_batchnorm / revert_sync_batchnorm keep the very same tensors, flags and state_dict."""
from __future__ import annotations

import torch
import torch.nn as nn

from src.syncbn import (
    SyncBatchNorm, SyncBatchNorm1d, SyncBatchNorm2d, SyncBatchNorm3d, convert_sync_batchnorm, revert_sync_batchnorm,
)


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
