"""Segmentation's pictures: a mask laid over its image, each class in its colour (the colours of every task's
pictures, brighter than the palette of the mask PNGs), enlarged to be read, with a legend of the classes it shows;
for predict.py draw=true (one picture per input) and TensorBoard (image | ground truth | prediction rows). Rank 0
only, never communicating (src/tasks/pictures.py).

A class named "background" (any case, underscores ignored: "_background_") is left clear, not tinted black.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from src.precision import autocast, model_dtype, upcast
from src.tasks.pictures import (MIN_LONG_SIDE, TENSORBOARD_LONG_SIDE, Colour, add_legend, class_colour, class_name,
                                dataset_class_names, enlarge, enlargement, fixed_sample_indices, overlay_masks,
                                to_uint8_image)
from src.unwrap import eval_mode, unwrap_model

_IGNORE_COLOUR = (255, 255, 255)  # ignored pixels (the ground truth's ignore_index) are tinted white


def is_background(name: str) -> bool:
    """Whether a class is the background, which overlays leave clear."""
    return name.strip("_ ").lower() == "background"


def tint(pixels: torch.Tensor, mask: torch.Tensor, class_names: Sequence[str] | None,
         ignore_index: int = 255) -> tuple[torch.Tensor, list[int]]:
    """uint8 [3, H, W] `pixels` with every class of `mask` [H, W] (same size) laid over it in its colour (the
    background left clear, `ignore_index` white); and the classes shown."""
    m = mask.detach().to("cpu", torch.int64)
    shown = [c for c in torch.unique(m).tolist()
             if c != ignore_index and not is_background(class_name(class_names, c))]
    layers = [m == c for c in shown] + ([m == ignore_index] if (m == ignore_index).any() else [])
    colours = [class_colour(c) for c in shown] + [_IGNORE_COLOUR] * (len(layers) - len(shown))
    return overlay_masks(pixels, torch.stack(layers) if layers else m[:0].bool(), colours), shown


def legend(classes: Sequence[int], class_names: Sequence[str] | None) -> list[tuple[str, Colour]]:
    """Legend entries for these classes, in class order."""
    return [(class_name(class_names, c), class_colour(c)) for c in sorted(set(classes))]


def segmentation_overlay(pixels: torch.Tensor, mask: torch.Tensor, class_names: Sequence[str] | None, *,
                         min_long_side: int = MIN_LONG_SIDE) -> torch.Tensor:
    """predict.py's picture: the uint8 image `pixels` [3, H, W] enlarged (long side >= min_long_side) with the
    predicted `mask` [H, W] over it and a legend of the classes it shows."""
    factor = enlargement(*pixels.shape[-2:], min_long_side)
    picture, shown = tint(enlarge(pixels.cpu(), factor), enlarge(mask.cpu(), factor), class_names)
    return add_legend(picture, legend(shown, class_names))


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
    min_long_side: int = TENSORBOARD_LONG_SIDE,
) -> torch.Tensor:
    """One uint8 [3, H, W] picture: a row per index, image | ground truth | prediction, the masks over the image,
    each enlarged to a long side >= min_long_side, and a legend of every class shown.

    Rows keep their own height; narrower rows are padded (black) on the right to the widest.
    """
    device = torch.device(device)
    net = unwrap_model(model)
    names = dataset_class_names(dataset)
    rows, shown = [], set()
    with eval_mode(net):
        for index in indices:
            image, target = _sample(dataset, index)
            with autocast(amp, device):
                out = net(image.unsqueeze(0).to(device, model_dtype(net)))
            logits = upcast(out["out"] if isinstance(out, dict) else out)
            if logits.shape[-2:] != target.shape[-2:]:
                logits = F.interpolate(logits, size=target.shape[-2:], mode="bilinear", align_corners=False)
            pred = logits.argmax(1)[0]
            factor = enlargement(*target.shape[-2:], min_long_side)
            pixels = enlarge(to_uint8_image(image, mean, std), factor)
            truth, truth_shown = tint(pixels, enlarge(target.cpu(), factor), names, ignore_index)
            predicted, pred_shown = tint(pixels, enlarge(pred.cpu(), factor), names, ignore_index)
            shown.update(truth_shown + pred_shown)
            rows.append(torch.cat([pixels, truth, predicted], dim=2))
    if not rows:
        return torch.zeros(3, 1, 1, dtype=torch.uint8)
    width = max(r.shape[2] for r in rows)
    return add_legend(torch.cat([_pad_to(r, r.shape[1], width) for r in rows], dim=1), legend(shown, names))


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
