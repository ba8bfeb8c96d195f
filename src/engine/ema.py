"""Exponential moving average of weights and buffers (torch.optim.swa_utils, not hand-written)."""
from __future__ import annotations

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn


def build_ema(model: torch.nn.Module, decay: float) -> AveragedModel:
    """EMA copy of the unwrapped `model`; buffers (BN running stats) are averaged too (use_buffers=True)."""
    return AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)
