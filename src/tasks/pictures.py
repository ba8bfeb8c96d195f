"""What every task's pictures share (TensorBoard and predict.py draw=true): a normalised image back to uint8, the fixed
validation images shown after each evaluation, and the drawing a person can read: small images enlarged, one colour
per class, labels with class and score on a filled background, and a legend.

torchvision's draw_bounding_boxes and draw_segmentation_masks draw the boxes and masks; the labels and the legend are
drawn with PIL here because torchvision's text has a fixed 10-px default font (a TrueType font needs a file path),
lies inside the box where neighbouring labels cover each other, and there is no legend.

The trainer calls the tasks' pictures on rank 0 only. They never communicate: the model is unwrapped from DDP
and run in eval mode (SyncBN in eval mode uses running statistics and does not talk to other ranks).
"""
from __future__ import annotations

import colorsys
import math
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw, ImageFont
from torchvision.utils import draw_bounding_boxes, draw_segmentation_masks

MIN_LONG_SIDE = 512  # predict.py's pictures: smaller images are enlarged until their long side is at least this
TENSORBOARD_LONG_SIDE = 256  # TensorBoard's: smaller, a picture is stored at every evaluation
MASK_ALPHA = 0.5  # masks' opacity over the image
_GOLDEN = 0.618033988749895
_LEGEND_BACKGROUND = (255, 255, 255)
_LEGEND_TEXT = (0, 0, 0)
Colour = tuple[int, int, int]


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


def unit_to_uint8(image: torch.Tensor) -> torch.Tensor:
    """A float [3, H, W] image in 0..1 (what the detection models take) -> uint8 on the CPU."""
    return (image.detach().float().cpu().clamp(0, 1) * 255).round().to(torch.uint8)


def fixed_sample_indices(num_samples: int, count: int = 4) -> list[int]:
    """`count` evenly spaced dataset indices: the same images at every evaluation, for any world size."""
    count = min(count, num_samples)
    return [int(i) for i in np.linspace(0, num_samples - 1, count).round()] if count > 0 else []


def enlargement(height: int, width: int, min_long_side: int = MIN_LONG_SIDE) -> int:
    """The whole factor that brings the long side to at least `min_long_side` (1 for an image that large)."""
    return max(1, math.ceil(min_long_side / max(height, width, 1)))


def enlarge(pixels: torch.Tensor, factor: int) -> torch.Tensor:
    """[..., H, W] repeated `factor` times along both axes: every pixel a factor x factor square (nothing blurred)."""
    if factor == 1:
        return pixels
    return pixels.repeat_interleave(factor, dim=-2).repeat_interleave(factor, dim=-1)


def class_colour(label: int) -> Colour:
    """A bright colour of its own for class `label`: hues a golden-ratio step apart, so neighbouring classes
    differ most, for any number of classes."""
    r, g, b = colorsys.hsv_to_rgb((label * _GOLDEN) % 1.0, 0.85, 0.95)
    return round(r * 255), round(g * 255), round(b * 255)


def text_colour(background: Colour) -> Colour:
    """Black or white, whichever reads better on `background` (ITU-R BT.601 luma)."""
    r, g, b = background
    return (0, 0, 0) if 0.299 * r + 0.587 * g + 0.114 * b > 140 else (255, 255, 255)


def font(size: int) -> Any:
    """PIL's built-in font at `size` px (Pillow >= 10.1 with FreeType), else its fixed bitmap font."""
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, ImportError, OSError):  # older Pillow, or no FreeType
        return ImageFont.load_default()


def text_size(height: int, width: int) -> int:
    """Label text height for a picture of this size: readable at 512 px, growing with larger pictures."""
    return max(12, max(height, width) // 40)


def draw_labelled_boxes(pixels: torch.Tensor, boxes: torch.Tensor, labels: Sequence[str],
                        colours: Sequence[Colour], *, line: int | None = None) -> torch.Tensor:
    """uint8 [3, H, W] with each box (xyxy pixels) outlined in its colour and its label written on a filled
    background of that colour, above the box where there is room, else inside its top; a label that would cover
    one already written moves below or inside the box when that is free. Boxes and labels are drawn in the given
    order: pass the most important last."""
    height, width = pixels.shape[-2:]
    line = line or max(1, round(max(height, width) / 256))
    boxes = boxes.detach().float().cpu().reshape(-1, 4)
    if len(boxes):
        pixels = draw_bounding_boxes(pixels, boxes, colors=list(colours), width=line)
    picture = Image.fromarray(pixels.permute(1, 2, 0).numpy())
    draw = ImageDraw.Draw(picture)
    face = font(text_size(height, width))
    taken: list[tuple[float, float, float, float]] = []
    for box, label, colour in zip(boxes.tolist(), labels, colours):
        if not label:
            continue
        left, top, right, bottom = draw.textbbox((0, 0), label, font=face)
        w, h = right - left + 2 * line + 2, bottom - top + 2 * line + 2
        x = min(max(box[0], 0), max(width - w, 0))
        places = [box[1] - h, box[1], box[3], box[3] - h]  # above, inside top, below, inside bottom
        places = [y for y in places if 0 <= y <= height - h] or [max(min(box[1], height - h), 0)]
        free = [y for y in places if not any(_overlap((x, y, x + w, y + h), t) for t in taken)]
        y = (free or places)[0]
        taken.append((x, y, x + w, y + h))
        draw.rectangle((x, y, x + w - 1, y + h - 1), fill=colour)
        draw.text((x + line + 1 - left, y + line + 1 - top), label, fill=text_colour(colour), font=face)
    return _to_tensor(picture)


def overlay_masks(pixels: torch.Tensor, masks: torch.Tensor, colours: Sequence[Colour],
                  alpha: float = MASK_ALPHA) -> torch.Tensor:
    """uint8 [3, H, W] with each boolean [H, W] mask of `masks` [K, H, W] blended over it in its colour and outlined
    in that colour, unblended: a blend alone takes the hue of what lies beneath (red over green reads as olive), the
    outline keeps the colour of the legend. Masks of one colour are drawn as one (each outlined on its own)."""
    if not len(masks):
        return pixels
    masks = masks.cpu().bool()
    outlines = _outlines(masks, max(1, round(max(masks.shape[-2:]) / 256)))
    # One layer per colour: torchvision blends its masks one after another in Python, per mask.
    palette = sorted(set(colours), key=list(colours).index)
    layers, edges = [], []
    for colour in palette:
        mine = torch.tensor([c == colour for c in colours])
        layers.append(masks[mine].any(0))
        edges.append(outlines[mine].any(0))
    pixels = draw_segmentation_masks(pixels, torch.stack(layers), alpha=alpha, colors=palette)
    return draw_segmentation_masks(pixels, torch.stack(edges), alpha=1.0, colors=palette)


def add_legend(pixels: torch.Tensor, entries: Sequence[tuple[str, Colour]]) -> torch.Tensor:
    """uint8 [3, H, W] with a white strip on its right listing each (name, colour): a swatch and the name, in
    columns of the picture's height (the picture itself is left as it is). No entries: the picture unchanged."""
    if not entries:
        return pixels
    height, width = pixels.shape[-2:]
    face = font(text_size(height, width))
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    ascent = max(measure.textbbox((0, 0), "Ag", font=face)[3], 8)
    row = ascent + ascent // 2
    swatch, pad = ascent, ascent // 2
    names = [name for name, _ in entries]
    column = swatch + pad + max(measure.textbbox((0, 0), n, font=face)[2] for n in names) + 2 * pad
    per_column = max(1, (max(height, row) - pad) // row)
    columns = math.ceil(len(entries) / per_column)
    total_height = max(height, pad + min(len(entries), per_column) * row)
    picture = Image.new("RGB", (width + columns * column + pad, total_height), _LEGEND_BACKGROUND)
    picture.paste(Image.fromarray(pixels.permute(1, 2, 0).numpy()), (0, 0))
    draw = ImageDraw.Draw(picture)
    for n, (name, colour) in enumerate(entries):
        x = width + pad + (n // per_column) * column
        y = pad + (n % per_column) * row
        draw.rectangle((x, y, x + swatch - 1, y + swatch - 1), fill=colour, outline=_LEGEND_TEXT)
        draw.text((x + swatch + pad, y), name, fill=_LEGEND_TEXT, font=face)
    return _to_tensor(picture)


def class_name(class_names: Sequence[str] | None, label: int) -> str:
    """The name of class `label`, or its number when the run has no name for it."""
    return class_names[label] if class_names and 0 <= label < len(class_names) else f"class {label}"


def dataset_class_names(dataset: Any) -> list[str] | None:
    """The class names a dataset carries as `classes` (torchvision's convention, the shapes and COCO sets'), also
    through the wrappers of src/data (`.base`, `.dataset`); None when it has none."""
    for _ in range(4):
        names = getattr(dataset, "classes", None)
        if names:
            return [str(n) for n in names]
        dataset = getattr(dataset, "base", None) or getattr(dataset, "dataset", None)
        if dataset is None:
            break
    return None


def _outlines(masks: torch.Tensor, line: int, chunk: int = 16) -> torch.Tensor:
    """The pixels of each boolean mask [K, H, W] within `line` pixels (a square around each) of a pixel outside it;
    `chunk` masks at a time, to bound the float copies."""
    parts = []
    for part in masks.split(chunk):
        inner = -F.max_pool2d(-part.float().unsqueeze(1), 2 * line + 1, stride=1, padding=line).squeeze(1)  # erosion
        parts.append(part & (inner < 0.5))
    return torch.cat(parts)


def _overlap(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _to_tensor(picture: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.array(picture, dtype=np.uint8)).permute(2, 0, 1).contiguous()
