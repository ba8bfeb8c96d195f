"""Instance segmentation's files: one JSON row per instance (its box, class, score and RLE mask), and pictures of
an image with its masks and boxes drawn (detection's picture with the masks over it)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import torch

from src.tasks.detection.pictures import detection_picture
from src.tasks.instance_segmentation.masks import decode
from src.tasks.pictures import MIN_LONG_SIDE


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


def draw_instances(pixels: torch.Tensor, prediction: dict[str, Any], class_names: Sequence[str] | None, *,
                   score_threshold: float, every_box: bool = False, min_long_side: int = MIN_LONG_SIDE) -> torch.Tensor:
    """A uint8 [3, H, W] image enlarged, with the chosen instances' masks and boxes in their classes' colours, labelled
    with class and score, and a legend: detection's picture (src/tasks/detection/pictures.py) with the masks."""
    height, width = pixels.shape[-2:]
    return detection_picture(pixels, prediction, class_names, score_threshold=score_threshold, every_box=every_box,
                             masks=decode(prediction["rles"], height, width), min_long_side=min_long_side)
