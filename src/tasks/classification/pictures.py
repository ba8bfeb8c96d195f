"""Classification's TensorBoard pictures: a grid of training images, framed green or red by prediction."""
from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torchvision.utils import make_grid

from src.tasks.pictures import to_uint8_image


def classification_grid(
    images: torch.Tensor,
    targets: torch.Tensor | None = None,
    preds: torch.Tensor | None = None,
    *,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    nrow: int = 8,
    max_images: int = 32,
) -> torch.Tensor:
    """A uint8 [3, H, W] grid of the first `max_images` images; with preds, a green (right) or red
    (wrong) border around each."""
    n = min(len(images), max_images)
    tiles = [to_uint8_image(images[i], mean, std) for i in range(n)]
    if preds is not None and targets is not None:
        framed = []
        for i, tile in enumerate(tiles):
            colour = (0, 200, 0) if int(preds[i]) == int(targets[i]) else (220, 0, 0)
            border = torch.tensor(colour, dtype=torch.uint8).view(3, 1, 1)
            tile = F.pad(tile, (2, 2, 2, 2))
            tile[:, :2, :] = border
            tile[:, -2:, :] = border
            tile[:, :, :2] = border
            tile[:, :, -2:] = border
            framed.append(tile)
        tiles = framed
    if not tiles:
        return torch.zeros(3, 1, 1, dtype=torch.uint8)
    return make_grid(torch.stack(tiles), nrow=nrow, padding=2)


def log_classification_grid(
    writer: Any,
    images: torch.Tensor,
    step: int,
    *,
    targets: torch.Tensor | None = None,
    preds: torch.Tensor | None = None,
    tag: str = "train/samples",
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    nrow: int = 8,
) -> None:
    """Add a classification sample grid to a SummaryWriter (rank 0 only)."""
    grid = classification_grid(images, targets, preds, mean=mean, std=std, nrow=nrow)
    writer.add_image(tag, grid, global_step=step, dataformats="CHW")
