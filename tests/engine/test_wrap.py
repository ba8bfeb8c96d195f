"""src/engine/wrap.py on 2 gloo ranks: DDP takes rank 0's buffers once when it wraps the model, and again at
every forward only with trainer.broadcast_buffers=true; the same with PyTorch 2.11's DDP, which has one
broadcast_buffers= for both (this file runs with that PyTorch too)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from src.config import TrainerConfig
from tests.support.gloo import run_on_ranks


def _running_means(rank: int, world: int, broadcast: bool) -> list[float]:
    """BatchNorm's running mean (eval mode: not updated by the forward) after wrapping, then after a forward
    that follows a rank-local change."""
    from src.engine.wrap import wrap_model

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3)).eval()
    model[1].running_mean.fill_(float(rank + 1))  # ranks disagree before wrapping
    wrapped = wrap_model(model, TrainerConfig(broadcast_buffers=broadcast), torch.device("cpu"))
    assert isinstance(wrapped, nn.parallel.DistributedDataParallel)
    after_wrap = float(model[1].running_mean[0])
    model[1].running_mean.fill_(float(10 * (rank + 1)))
    wrapped(torch.ones(4, 2))
    return [after_wrap, float(model[1].running_mean[0])]


@pytest.mark.parametrize("broadcast", [False, True])
def test_buffers_are_synced_when_wrapped_and_at_each_forward_only_when_asked(broadcast: bool) -> None:
    synced_at_forward = [10.0, 10.0] if broadcast else [10.0, 20.0]
    results = run_on_ranks(2, _running_means, broadcast)
    assert [r[0] for r in results] == [1.0, 1.0]  # rank 0's, on both
    assert [r[1] for r in results] == synced_at_forward
