"""Segmentation's TensorBoard pictures: image | ground truth | prediction panels, coloured with the palette of
the PNG exports (src/data/segmentation/palette.py). Rank 0 only, never communicating (src/tasks/pictures.py).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from src.data.segmentation.palette import color_palette
from src.precision import autocast, model_dtype, upcast
from src.tasks.pictures import fixed_sample_indices, to_uint8_image
from src.unwrap import eval_mode, unwrap_model

_IGNORE_COLOUR = (255, 255, 255)  # ignored pixels are drawn white in the ground-truth panel


def colorize_mask(mask: torch.Tensor, ignore_index: int = 255) -> torch.Tensor:
    """[H, W] class indices -> [3, H, W] uint8 RGB; `ignore_index` pixels white."""
    palette = torch.from_numpy(color_palette())
    m = mask.detach().to("cpu", torch.int64)
    rgb = palette[m.clamp(0, 255)]
    rgb[m == ignore_index] = torch.tensor(_IGNORE_COLOUR, dtype=torch.uint8)
    return rgb.permute(2, 0, 1).contiguous()


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
