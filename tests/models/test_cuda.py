"""GPU checks for the models (marked `cuda`: skipped without a GPU): an ImageNet ResNet-18 here; a task's own
models run the same checks with their configuration (its test module imports these and sets cuda_model_cfg)."""
from __future__ import annotations

import pytest
import torch

from src.models import NormConfig, build_model
from tests.models.test_syncbn_model import outputs


@pytest.fixture
def cuda_model_cfg() -> dict:
    """The model configuration these checks run (a task's test module overrides it)."""
    return {"name": "resnet18"}


@pytest.mark.cuda
def test_torch_syncbn_accepted_and_matches_bn_on_one_gpu(cuda_model_cfg: dict) -> None:
    NormConfig(name="torch_syncbn").validate(device="cuda")  # CUDA + NCCL present: no error
    torch.manual_seed(0)
    bn = build_model(cuda_model_cfg, {"name": "bn"}, 3).cuda()
    sync = build_model(cuda_model_cfg, {"name": "torch_syncbn"}, 3).cuda()
    sync.load_state_dict(bn.state_dict())
    x = torch.randn(2, 3, 64, 64, device="cuda")
    # Without a process group nn.SyncBatchNorm is BatchNorm: same forward, same statistics.
    for out_bn, out_sync in zip(outputs(bn(x)), outputs(sync(x))):
        torch.testing.assert_close(out_sync, out_bn, rtol=1e-4, atol=1e-4)  # TF32/cuDNN algorithm choices


@pytest.mark.cuda
@pytest.mark.parametrize("norm", ["bn", "gn", "frozen_bn"])
def test_training_step_on_gpu_channels_last(cuda_model_cfg: dict, norm: str) -> None:
    model = build_model(cuda_model_cfg, {"name": norm}, 3).cuda().to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 65, 97, device="cuda").to(memory_format=torch.channels_last)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = outputs(model(x))
    sum(o.float().mean() for o in out).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
