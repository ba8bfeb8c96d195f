"""What every task's TensorBoard pictures share: a normalised image back to uint8 for display, and the fixed
validation images shown after each evaluation.

The trainer calls the tasks' pictures on rank 0 only. They never communicate: the model is unwrapped from DDP
and run in eval mode (SyncBN in eval mode uses running statistics and does not talk to other ranks).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch


def to_uint8_image(
    image: torch.Tensor, mean: Sequence[float] | None = None, std: Sequence[float] | None = None
) -> torch.Tensor:
    """A normalised [3, H, W] float image -> [3, H, W] uint8 for display.

    With mean/std the normalisation is undone exactly; without them the image is min-max stretched,
    which is fine for looking at it.
    """
    x = image.detach().to("cpu", torch.float32)
    if mean is not None and std is not None:
        x = x * torch.tensor(std).view(-1, 1, 1) + torch.tensor(mean).view(-1, 1, 1)
    else:
        lo, hi = x.min(), x.max()
        x = (x - lo) / (hi - lo).clamp(min=1e-8)
    return (x.clamp(0, 1) * 255).round().to(torch.uint8)


def fixed_sample_indices(num_samples: int, count: int = 4) -> list[int]:
    """`count` evenly spaced dataset indices: the same images at every evaluation, for any world size."""
    count = min(count, num_samples)
    return [int(i) for i in np.linspace(0, num_samples - 1, count).round()] if count > 0 else []
