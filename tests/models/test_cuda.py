"""GPU checks for the models (marked `cuda`: skipped without a GPU)."""
from __future__ import annotations

import pytest
import torch

from src.models import NormConfig, build_model

CFG = {"name": "deeplabv3plus_resnet18", "aux_loss_weight": 0.5, "head_channels": 32}


@pytest.mark.cuda
def test_torch_syncbn_accepted_and_matches_bn_on_one_gpu() -> None:
    NormConfig(name="torch_syncbn").validate(device="cuda")  # CUDA + NCCL present: no error
    torch.manual_seed(0)
    bn = build_model(CFG, {"name": "bn"}, 3).cuda()
    sync = build_model(CFG, {"name": "torch_syncbn"}, 3).cuda()
    sync.load_state_dict(bn.state_dict())
    x = torch.randn(2, 3, 64, 64, device="cuda")
    # Without a process group nn.SyncBatchNorm is BatchNorm: same forward, same statistics.
    out_bn, out_sync = bn(x)["out"], sync(x)["out"]
    torch.testing.assert_close(out_sync, out_bn, rtol=1e-4, atol=1e-4)  # TF32/cuDNN algorithm choices
    assert out_sync.shape == (2, 3, 64, 64)


@pytest.mark.cuda
@pytest.mark.parametrize("norm", ["bn", "gn", "frozen_bn"])
def test_segmentation_step_on_gpu_channels_last(norm: str) -> None:
    model = build_model(CFG, {"name": norm}, 3).cuda().to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 65, 97, device="cuda").to(memory_format=torch.channels_last)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(x)
    assert out["out"].shape == out["aux"].shape == (2, 3, 65, 97)
    (out["out"].float().mean() + out["aux"].float().mean()).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
