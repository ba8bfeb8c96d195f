"""Tiny COCO-format folders on disk: `data=coco`'s layout, with images whose boxes are painted in.

    root/<split>/<file_name>                    images (PNG, or JPEG by the name's extension)
    root/annotations/instances_<split>.json     the annotation dict as given

Each annotated box is filled with its category's colour on a grey background, so a model or a metric sees
the objects where the json says they are.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

# Category ids not contiguous and listed out of order on purpose: labels must follow the ids (3 -> 1, 7 -> 2).
CATEGORIES = [{"id": 7, "name": "dog"}, {"id": 3, "name": "cat"}]
CLASS_NAMES = ["background", "cat", "dog"]
COLOURS = {3: (220, 40, 40), 7: (40, 40, 220), 12: (40, 200, 40)}  # each category's paint


def tiny_coco() -> dict[str, Any]:
    """Four images (one JPEG, one without annotations), both categories, one crowd and one zero-width box.

    Non-square images (H != W), so a swapped canvas size shows. What survives the cleaning, per image id:
    1: cat [2, 3, 12, 8] and dog [20, 10, 30, 22]; 2: dog [0, 0, 16, 12] (its crowd box dropped);
    3: cat [5, 5, 25, 15] (its zero-width box dropped); 4: none.
    """
    images = [{"id": 1, "file_name": "a.png", "width": 40, "height": 24},
              {"id": 2, "file_name": "b.jpg", "width": 32, "height": 20},
              {"id": 3, "file_name": "sub/c.png", "width": 36, "height": 28},
              {"id": 4, "file_name": "d.png", "width": 16, "height": 16}]
    boxes = [(1, 3, [2, 3, 10, 5], 0), (1, 7, [20, 10, 10, 12], 0), (2, 7, [0, 0, 16, 12], 0),
             (2, 3, [4, 4, 20, 10], 1), (3, 3, [5, 5, 20, 10], 0), (3, 7, [8, 8, 0, 6], 0)]
    annotations = [{"id": 100 + i, "image_id": img, "category_id": cat, "bbox": bbox, "iscrowd": crowd,
                    "area": bbox[2] * bbox[3]} for i, (img, cat, bbox, crowd) in enumerate(boxes)]
    return {"images": images, "annotations": annotations, "categories": copy.deepcopy(CATEGORIES)}


# varied_coco's categories: ids not contiguous and out of order (labels: 3 -> 1, 7 -> 2, 12 -> 3).
VARIED_CATEGORIES = [{"id": 7, "name": "dog"}, {"id": 12, "name": "bird"}, {"id": 3, "name": "cat"}]
VARIED_CLASS_NAMES = ["background", "cat", "dog", "bird"]


def varied_coco() -> dict[str, Any]:
    """Nine images of nine sizes (40-96 px a side) with what COCO's evaluation treats specially.

    Image ids not contiguous nor in file order; two images without objects (21, 2000); crowd regions over
    objects (8, 57); boxes the training targets drop or change: under a pixel (22), of zero width (100),
    overhanging the image (40); an `area` smaller than the box (8's crowd, 40's cat: COCO's areas are the
    segments'). Every annotation has `area` and `iscrowd`, as COCO's files do, so pycocotools reads it as is.
    """
    sizes = {3: (56, 40), 8: (48, 72), 21: (64, 64), 22: (80, 52), 40: (40, 88), 57: (96, 60), 100: (60, 60),
             101: (72, 48), 2000: (44, 44)}  # id: (width, height)
    order = [57, 3, 22, 8, 2000, 40, 101, 21, 100]
    images = [{"id": i, "file_name": f"img{i}.png", "width": sizes[i][0], "height": sizes[i][1]} for i in order]
    boxes = [  # (image id, category id, [x, y, w, h], iscrowd, area or None for w * h)
        (3, 3, [4, 4, 20, 14], 0, None), (3, 7, [30, 10, 22, 24], 0, None),
        (8, 7, [0, 0, 48, 30], 1, 1000.0), (8, 3, [10, 40, 16, 20], 0, None),
        (22, 12, [5, 5, 30, 30], 0, None), (22, 12, [45, 8, 28, 36], 0, None), (22, 3, [70.2, 45.1, 0.6, 0.8], 0, None),
        (40, 3, [2, 2, 36, 40], 0, 900.0), (40, 7, [20, 60, 30, 40], 0, None),
        (57, 3, [50, 0, 46, 60], 1, 2000.0), (57, 7, [4, 10, 30, 30], 0, None),
        (100, 3, [10, 10, 0, 20], 0, None),
        (101, 7, [8, 8, 24, 24], 0, None), (101, 7, [40, 16, 24, 24], 0, None),
    ]
    annotations = [{"id": 500 + 7 * k, "image_id": img, "category_id": cat, "bbox": bbox, "iscrowd": crowd,
                    "area": bbox[2] * bbox[3] if area is None else area}
                   for k, (img, cat, bbox, crowd, area) in enumerate(boxes)]
    return {"images": images, "annotations": annotations, "categories": copy.deepcopy(VARIED_CATEGORIES)}


def write_coco_split(root: Path, split: str, data: dict[str, Any]) -> Path:
    """Write `data` as root/annotations/instances_<split>.json and its images under root/<split>/.

    Image sizes come from each entry's width and height; returns the json's path.
    """
    for im in data.get("images", []):
        pixels = np.full((im["height"], im["width"], 3), 128, dtype=np.uint8)
        for a in data.get("annotations", []):
            if a.get("image_id") == im["id"] and len(a.get("bbox", ())) == 4:
                x, y, w, h = (int(round(v)) for v in a["bbox"])
                pixels[max(y, 0):y + h, max(x, 0):x + w] = COLOURS.get(a.get("category_id"), (0, 200, 0))
        path = root / split / im["file_name"]
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(path, **({"quality": 95} if path.suffix == ".jpg" else {}))
    ann = root / "annotations" / f"instances_{split}.json"
    ann.parent.mkdir(parents=True, exist_ok=True)
    ann.write_text(json.dumps(data))
    return ann


def write_coco_folder(root: Path, train: dict[str, Any] | None = None, val: dict[str, Any] | None = None) -> Path:
    """root/{train,val}/ and root/annotations/instances_{train,val}.json (tiny_coco() for each by default)."""
    write_coco_split(root, "train", tiny_coco() if train is None else train)
    write_coco_split(root, "val", tiny_coco() if val is None else val)
    return root


def with_segmentations(data: dict[str, Any]) -> dict[str, Any]:
    """`data` (varied_coco()) with COCO's segmentation of every annotation, in each form COCO's files use: an
    octagon polygon inside each box; the last non-crowd annotation instead as a compressed run-length encoding
    (its "counts" a string) of that octagon; each crowd region as an uncompressed one (a list) of its box, its
    area the encoding's."""
    from pycocotools import mask as coco_mask  # as the datasets do: only the COCO tests need pycocotools

    data = copy.deepcopy(data)
    sizes = {im["id"]: (im["height"], im["width"]) for im in data["images"]}
    last = max(k for k, a in enumerate(data["annotations"]) if not a["iscrowd"])
    for k, a in enumerate(data["annotations"]):
        x, y, w, h = a["bbox"]
        height, width = sizes[a["image_id"]]
        if a["iscrowd"]:
            region = np.zeros((height, width), dtype=np.uint8, order="F")
            region[int(y):int(y + h), int(x):int(x + w)] = 1
            a["segmentation"] = {"size": [height, width], "counts": uncompressed_rle(region)}
            a["area"] = float(coco_mask.area(coco_mask.encode(region)))
            continue
        cut_x, cut_y = w / 4, h / 4
        polygon = [x + cut_x, y, x + w - cut_x, y, x + w, y + cut_y, x + w, y + h - cut_y,
                   x + w - cut_x, y + h, x + cut_x, y + h, x, y + h - cut_y, x, y + cut_y]
        if k == last:
            rle = coco_mask.merge(coco_mask.frPyObjects([polygon], height, width))
            a["segmentation"] = {"size": [height, width], "counts": rle["counts"].decode("ascii")}
        else:
            a["segmentation"] = [polygon]
    return data


def uncompressed_rle(region: np.ndarray) -> list[int]:
    """Run lengths of a binary mask in column-major order, starting with zeros (COCO's uncompressed RLE)."""
    flat = region.flatten(order="F")
    changes = np.flatnonzero(np.diff(np.concatenate([[0], flat, [1 - flat[-1]]])))
    return np.diff(np.concatenate([[0], changes])).tolist()
