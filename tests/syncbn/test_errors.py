"""Misuse gives the same errors as PyTorch's batch norm layers, with words that say what to do.

The multi-process error (one value per channel in the whole group, raised on every rank without a
hang) is in test_collective_protocol.py.
"""
from __future__ import annotations

import pytest
import torch

from src.syncbn import SyncBatchNorm, SyncBatchNorm1d, SyncBatchNorm2d, SyncBatchNorm3d

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


@pytest.mark.parametrize("cls,bad_shapes,message", [
    (SyncBatchNorm, [(3,), ()], "expected at least 2D input"),
    (SyncBatchNorm1d, [(3,), (2, 3, 4, 4)], "expected 2D or 3D input"),
    (SyncBatchNorm2d, [(2, 3), (2, 3, 4), (2, 3, 4, 4, 4)], "expected 4D input"),
    (SyncBatchNorm3d, [(2, 3, 4), (2, 3, 4, 4)], "expected 5D input"),
])
@pytest.mark.parametrize("training", [True, False])
def test_wrong_number_of_dims(cls: type, bad_shapes: list, message: str, training: bool) -> None:
    layer = cls(3).train(training)
    for shape in bad_shapes:
        with pytest.raises(ValueError, match=message):
            layer(torch.randn(shape))


def test_wrong_channel_count_says_which() -> None:
    with pytest.raises(ValueError, match=r"SyncBatchNorm2d\(3\).*5 channels.*num_features=5"):
        SyncBatchNorm2d(3)(torch.randn(2, 5, 4, 4))


@pytest.mark.parametrize("eps", [0.0, -1.0])
def test_eps_must_be_positive_when_training(eps: float) -> None:
    # the same error PyTorch's module_db error inputs expect from BatchNorm1d/2d/3d
    with pytest.raises(ValueError, match="eps must be positive"):
        SyncBatchNorm2d(3, eps=eps)(torch.randn(2, 3, 4, 4))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(1, 3), (1, 3, 1), (1, 3, 1, 1)])
def test_one_value_per_channel_when_training(shape: tuple, device: str) -> None:
    layer = SyncBatchNorm(3, device=device)
    with pytest.raises(ValueError, match="Expected more than 1 value per channel when training"):
        layer(torch.randn(shape, device=device))
    layer.eval()
    assert layer(torch.randn(shape, device=device)).shape == shape  # eval uses running stats: fine


def test_dataparallel_replica_is_refused() -> None:
    layer = SyncBatchNorm2d(3)
    layer._is_replica = True  # what nn.DataParallel's replicate() sets on every replica
    with pytest.raises(RuntimeError, match="DataParallel.*torchrun.*DistributedDataParallel"):
        layer(torch.randn(2, 3, 4, 4))


@pytest.mark.cuda
def test_real_dataparallel_replica_is_refused() -> None:
    layer = SyncBatchNorm2d(3).cuda()
    replica = torch.nn.parallel.replicate(layer, [0])[0]
    with pytest.raises(RuntimeError, match="DataParallel"):
        replica(torch.randn(2, 3, 4, 4, device="cuda"))
