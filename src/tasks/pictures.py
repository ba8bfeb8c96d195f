"""Pictures for TensorBoard: image | ground truth | prediction panels (segmentation) and sample grids
(classification), coloured with the palette of the PNG exports (src/data/palette.py).

The trainer calls these on rank 0 only. They never communicate: the model is unwrapped from DDP and run
in eval mode (SyncBN in eval mode uses running statistics and does not talk to other ranks).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torchvision.utils import make_grid

from src.precision import autocast, model_dtype, upcast
from src.unwrap import eval_mode, unwrap_model
from src.data.palette import color_palette

_IGNORE_COLOUR = (255, 255, 255)  # ignored pixels are drawn white in the ground-truth panel


def colorize_mask(mask: torch.Tensor, ignore_index: int = 255) -> torch.Tensor:
    """[H, W] class indices -> [3, H, W] uint8 RGB; `ignore_index` pixels white."""
    palette = torch.from_numpy(color_palette())
    m = mask.detach().to("cpu", torch.int64)
    rgb = palette[m.clamp(0, 255)]
    rgb[m == ignore_index] = torch.tensor(_IGNORE_COLOUR, dtype=torch.uint8)
    return rgb.permute(2, 0, 1).contiguous()


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


def _sample(dataset: Any, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    item = dataset[index]
    return item[0], torch.as_tensor(item[1])  # datasets may also return the index third


def _pad_to(x: torch.Tensor, height: int, width: int) -> torch.Tensor:
    return F.pad(x, (0, width - x.shape[-1], 0, height - x.shape[-2]))


@torch.inference_mode()
def segmentation_panels(
    model: nn.Module,
    dataset: Any,
    indices: Sequence[int],
    device: torch.device | str,
    *,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    ignore_index: int = 255,
    amp: str = "none",
) -> torch.Tensor:
    """One uint8 [3, H, W] picture: a row per index, image | ground truth | prediction, each at its own size.

    Rows keep their own height; narrower rows are padded (black) on the right to the widest.
    """
    device = torch.device(device)
    net = unwrap_model(model)
    rows = []
    with eval_mode(net):
        for index in indices:
            image, target = _sample(dataset, index)
            with autocast(amp, device):
                out = net(image.unsqueeze(0).to(device, model_dtype(net)))
            logits = upcast(out["out"] if isinstance(out, dict) else out)
            if logits.shape[-2:] != target.shape[-2:]:
                logits = F.interpolate(logits, size=target.shape[-2:], mode="bilinear", align_corners=False)
            pred = logits.argmax(1)[0]
            rows.append(torch.cat([to_uint8_image(image, mean, std), colorize_mask(target, ignore_index),
                                   colorize_mask(pred, ignore_index)], dim=2))
    if not rows:
        return torch.zeros(3, 1, 1, dtype=torch.uint8)
    width = max(r.shape[2] for r in rows)
    return torch.cat([_pad_to(r, r.shape[1], width) for r in rows], dim=1)


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


def log_segmentation_panels(
    writer: Any,
    model: nn.Module,
    dataset: Any,
    step: int,
    device: torch.device | str,
    *,
    indices: Sequence[int] | None = None,
    count: int = 4,
    tag: str = "val/panels",
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    ignore_index: int = 255,
    amp: str = "none",
) -> list[int]:
    """Add image | ground truth | prediction panels to a SummaryWriter (rank 0 only); returns the indices."""
    chosen = list(indices) if indices is not None else fixed_sample_indices(len(dataset), count)
    panel = segmentation_panels(model, dataset, chosen, device, mean=mean, std=std,
                                ignore_index=ignore_index, amp=amp)
    writer.add_image(tag, panel, global_step=step, dataformats="CHW")
    return chosen


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
