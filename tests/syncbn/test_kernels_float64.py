"""float64 SyncBN is as precise as PyTorch's float64 BatchNorm, against exact values (precision_cases.py).

Per layout, at |mean| / std of 1e4 and 1e8: a training forward of SyncBatchNorm with momentum=1 (one process: our CPU
kernels' statistics and merge) leaves the batch's mean and unbiased variance in its running buffers; their errors
must be within 10x of nn.BatchNorm's on the same values. (The CUDA kernels' statistics: test_cuda_kernel_fixes.py.)
"""
from __future__ import annotations

import pytest
import torch

from src.syncbn import SyncBatchNorm1d, SyncBatchNorm2d, SyncBatchNorm3d
from tests.syncbn import precision_cases as pc

MODULES = {2: SyncBatchNorm1d, 3: SyncBatchNorm1d, 4: SyncBatchNorm2d, 5: SyncBatchNorm3d}


@pytest.mark.parametrize("ratio", pc.FLOAT64_RATIOS, ids=lambda r: f"{r:g}")
@pytest.mark.parametrize("layout", list(pc.FLOAT64_LAYOUTS))
def test_float64_statistics_as_precise_as_batchnorm(layout, ratio):
    x = pc.make_float64(layout, ratio)
    ours = MODULES[x.dim()](x.shape[1], momentum=1.0, dtype=torch.float64).train()
    with torch.no_grad():
        ours(x)
    for what, (ours_err, theirs_err) in pc.float64_errors(x, ours.running_mean, ours.running_var).items():
        assert ours_err <= 10 * theirs_err, f"{what}: relative error {ours_err:.3g}, nn.BatchNorm's {theirs_err:.3g}"
