"""The trainer's side of the SyncBN CUDA self-check (src/models/norms.py): norm.cuda_selfcheck validated with the
config, and the fallback to nn.SyncBatchNorm keeping the layers' tensors; the check itself stubbed (no GPU).
The gate's own tests are in tests/syncbn/test_selfcheck.py."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from src.models.config import NormConfig
from src.models.norms import checked_cuda_syncbn, finalize_norms


def test_fallback_swaps_in_torch_syncbn_with_the_same_tensors(monkeypatch):
    import src.syncbn.selfcheck as module

    monkeypatch.setattr(module, "ensure_cuda_kernels_checked", lambda device, mode: False)
    cfg = NormConfig(name="syncbn", cuda_selfcheck="fallback")
    model = finalize_norms(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)), cfg)
    weight = model[1].weight
    out = checked_cuda_syncbn(model, cfg, torch.device("cuda", 0))
    assert type(out[1]) is nn.SyncBatchNorm and out[1].weight is weight
    kept = finalize_norms(nn.Sequential(nn.BatchNorm2d(4)), cfg)
    assert checked_cuda_syncbn(kept, cfg, torch.device("cpu")) is kept  # CPU: nothing to check


def test_config_key_is_validated_early():
    with pytest.raises(ValueError, match="norm.cuda_selfcheck must be one of error, fallback, off; got 'maybe'"):
        NormConfig(name="syncbn", cuda_selfcheck="maybe").validate(device=None)
    with pytest.raises(ValueError, match="norm.cuda_selfcheck=fallback cannot keep norm.group_size"):
        NormConfig(name="syncbn", cuda_selfcheck="fallback", group_size=2).validate(device=None)
    NormConfig(name="syncbn", cuda_selfcheck="off").validate(device=None)
