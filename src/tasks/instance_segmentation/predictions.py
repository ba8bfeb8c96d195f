"""Instance segmentation's files: one JSON row per instance (its box, class, score and RLE mask), and pictures of
an image with its masks and boxes drawn (torchvision.utils.draw_segmentation_masks)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torchvision.utils import draw_bounding_boxes, draw_segmentation_masks

from src.tasks.instance_segmentation.masks import decode

MASK_ALPHA = 0.5  # the masks' opacity over the image


def write_instances_json(path: Path, names: list[str], predictions: list[dict[str, Any]], class_names: list[str], *,
                         key: str = "file", score_threshold: float = 0.0) -> int:
    """One JSON row per instance: {key: name, "class", "score", "x1", "y1", "x2", "y2" (pixels), "segmentation":
    COCO's compressed RLE {"size": [h, w], "counts"}}; returns the number of rows."""
    rows = []
    for name, p in zip(names, predictions):
        for box, score, label, rle in zip(p["boxes"].tolist(), p["scores"].tolist(), p["labels"].tolist(), p["rles"]):
            if score >= score_threshold:
                cls = class_names[label] if 0 <= label < len(class_names) else str(label)
                rows.append({key: name, "class": cls, "score": round(score, 6),
                             **{c: round(v, 2) for c, v in zip(("x1", "y1", "x2", "y2"), box)}, "segmentation": rle})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, indent=1) + "\n")
    return len(rows)


def draw_instances(image: torch.Tensor, prediction: dict[str, Any], labels: list[str],
                   keep: torch.Tensor | None = None) -> torch.Tensor:
    """A float [3, H, W] image in 0..1 with the instances' masks (one colour each) and boxes drawn (uint8)."""
    pixels = (image.detach().float().cpu().clamp(0, 1) * 255).round().to(torch.uint8)
    height, width = pixels.shape[-2:]
    masks = decode(prediction["rles"], height, width)
    boxes = prediction["boxes"].detach().float().cpu().reshape(-1, 4)
    if keep is not None:
        masks, boxes = masks[keep], boxes[keep]
    if len(masks):
        pixels = draw_segmentation_masks(pixels, masks, alpha=MASK_ALPHA)
    return draw_bounding_boxes(pixels, boxes, labels=labels, colors="red", width=1)
