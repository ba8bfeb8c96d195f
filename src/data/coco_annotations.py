"""COCO-format annotation files: read, checked entry by entry, and cleaned for training.

Checked (each error names the file and the entries, up to a few of each kind, with their count):
- the file is JSON holding an object with the lists "images", "annotations" and "categories";
- every category has an integer "id" (unique) and a "name"; every image an integer "id" (unique) and a
  "file_name"; every annotation an "image_id" and a "category_id" that the file defines and a "bbox" of
  4 finite numbers [x, y, width, height];
- every image file exists under the images folder (existence only: a corrupt file fails when it is read);
- with `masks` (instance segmentation), every annotation has a "segmentation" as COCO writes them: a list of
  polygons [x1, y1, x2, y2, ...] (at least 3 points each), or a run-length encoding {"size": [height, width],
  "counts": ...} (compressed: a string; uncompressed: a list of integers) of the image's size.

Cleaned for training: crowd annotations ("iscrowd": 1, regions of many objects) and boxes of zero or negative
width or height are dropped (counted); category ids are mapped to contiguous labels 1..K in increasing id order
(0 is the background); annotation ids are renumbered 1..N (no annotation is looked up by its own id).

Kept as the file has it for evaluation (`image_truths`): each image's entry and all its annotations, crowd
regions, boxes of any size and the annotations' `area` included, with the file's image and category ids; COCO's
evaluation reads these (src/evaluation/coco.py).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from src.errors import MissingFileError

_SHOWN = 5  # entries named per kind of problem


COCO_TRUTH_KEY = "coco"  # an evaluation target's entry holding its image's CocoImageTruth


@dataclass
class CocoAnnotations:
    """One split's annotations after the checks: `data` is a COCO dict whose category ids are the labels."""

    path: Path
    data: dict[str, Any]  # "images", "annotations" (category_id = label 1..K), "categories" (id = label)
    categories: list[tuple[int, str]]  # (original category id, name), in id order: label k is entry k - 1
    crowd_dropped: int = 0
    degenerate_dropped: int = 0
    # The file's own "images" and "annotations" lists (checked, not cleaned): what evaluation compares with.
    source: dict[str, list[dict[str, Any]]] | None = None


@dataclass(frozen=True)
class CocoImageTruth:
    """One image's ground truth as its COCO file has it: what COCO's evaluation of its predictions reads.

    A plain object, not a dict: torchvision's v2 transforms pass it through untouched (they would walk a
    dict's every polygon coordinate), and it travels with the image's evaluation target.
    """

    image: dict[str, Any]  # the file's image entry: "id", and "width", "height" (filled from the image if absent)
    annotations: tuple[dict[str, Any], ...]  # the image's annotations in file order, unchanged (crowd, area, ...)
    category_ids: tuple[int, ...]  # every category id of the file, in id order: label k is category_ids[k - 1]


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _integer(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _entry(kind: str, i: int, item: Any) -> str:
    """How an entry is named in messages: its position and, when it has one, its id."""
    ident = item.get("id") if isinstance(item, dict) else None
    return f"{kind}[{i}]" + (f" (id {ident!r})" if ident is not None else "")


def _raise(path: Path, problems: list[str], what: str) -> None:
    if problems:
        shown = "; ".join(problems[:_SHOWN]) + ("; ..." if len(problems) > _SHOWN else "")
        raise ValueError(f"{path}: {len(problems)} problem(s) in {what!r}: {shown}")


def read_json(path: Path) -> dict[str, Any]:
    """The file's object with its three COCO lists; ValueError naming the file and what is missing otherwise."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not a JSON file ({exc}); a COCO annotation file is a JSON object") from None
    lists = ("images", "annotations", "categories")
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds a JSON {type(data).__name__}, not a COCO annotation file (an object with "
                         f"the lists {', '.join(map(repr, lists))})")
    missing = [k for k in lists if not isinstance(data.get(k), list)]
    if missing:
        raise ValueError(f"{path} is not a COCO annotation file: {', '.join(map(repr, missing))} missing or not a "
                         f"list (a COCO file is an object with the lists {', '.join(map(repr, lists))})")
    return data


def _with_ids(key: str, entries: list[Any], text: str, what: str) -> tuple[list[str], list[dict[str, Any]]]:
    """(problems, the well-formed entries) of a list whose entries need an integer 'id', unique, and a string
    `text` field ('name' of a category, 'file_name' of an image)."""
    problems, seen, good = [], set(), []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not _integer(entry.get("id")) or not isinstance(entry.get(text), str):
            problems.append(f"{_entry(key, i, entry)} needs an integer 'id' and a string '{text}'")
        elif entry["id"] in seen:
            problems.append(f"{_entry(key, i, entry)} repeats {what} id {entry['id']}")
        else:
            seen.add(entry["id"])
            good.append(entry)
    return problems, good


def _categories(path: Path, entries: list[Any]) -> list[tuple[int, str]]:
    problems, _ = _with_ids("categories", entries, "name", "category")
    _raise(path, problems, "categories")
    if not entries:
        raise ValueError(f"{path} defines no categories: 'categories' must list the classes "
                         "([{\"id\": 1, \"name\": \"cat\"}, ...])")
    return sorted((c["id"], c["name"]) for c in entries)


def _images(path: Path, entries: list[Any], images_dir: Path) -> None:
    problems, good = _with_ids("images", entries, "file_name", "image")
    _raise(path, problems, "images")
    absent = [f"{im['file_name']!r} (image id {im['id']})" for im in good if not (images_dir / im["file_name"]).is_file()]
    if absent:
        shown = ", ".join(absent[:_SHOWN]) + (", ..." if len(absent) > _SHOWN else "")
        raise MissingFileError(f"{path} lists {len(absent)} image(s) that are not in {images_dir.resolve()}: "
                               f"{shown}; each 'file_name' is relative to that folder")


def _segmentation_problem(segmentation: Any, image: dict[str, Any]) -> str | None:
    """Why an annotation's "segmentation" is not one COCO's tools read (None: it is)."""
    if isinstance(segmentation, list):
        if not segmentation:
            return "has an empty 'segmentation' (no polygon)"
        for polygon in segmentation:
            if (not isinstance(polygon, list) or len(polygon) < 6 or len(polygon) % 2
                    or not all(_number(v) for v in polygon)):
                return ("has a 'segmentation' polygon that is not [x1, y1, x2, y2, ...] with at least 3 points: "
                        f"{str(polygon)[:60]}")
        return None
    if isinstance(segmentation, dict):
        size, counts = segmentation.get("size"), segmentation.get("counts")
        if not (isinstance(size, list) and len(size) == 2 and all(_integer(v) and v > 0 for v in size)):
            return f"has a run-length 'segmentation' whose 'size' is {size!r}, not [height, width]"
        if not (isinstance(counts, str) or (isinstance(counts, list) and all(_integer(v) and v >= 0 for v in counts))):
            return "has a run-length 'segmentation' whose 'counts' is neither a string nor a list of integers"
        expected = [image.get("height"), image.get("width")]
        if None not in expected and size != expected:
            return f"has a run-length 'segmentation' of size {size}, but its image is {expected} (height, width)"
        return None
    return ("has no 'segmentation' (instance segmentation needs each object's mask: polygons or run-length "
            "encoding, as COCO's instances files have)" if segmentation is None else
            f"has a 'segmentation' of type {type(segmentation).__name__}: it must be a list of polygons or a "
            "run-length encoding")


def load_annotations(path: Path, images_dir: Path, masks: bool = False) -> CocoAnnotations:
    """Read, check and clean one split's annotation file (see the module docstring); errors name the entries.

    `masks`: every annotation must have a valid "segmentation", which the cleaned annotations keep.
    """
    data = read_json(path)
    categories = _categories(path, data["categories"])
    _images(path, data["images"], images_dir)
    label_of = {cid: k for k, (cid, _) in enumerate(categories, start=1)}
    image_ids = {im["id"] for im in data["images"]}
    image_of = {im["id"]: im for im in data["images"]}
    known_ids = ", ".join(str(c) for c, _ in categories[:20]) + (", ..." if len(categories) > 20 else "")
    problems: list[str] = []
    kept: list[dict[str, Any]] = []
    crowd = degenerate = 0
    for i, a in enumerate(data["annotations"]):
        name = _entry("annotations", i, a)
        if not isinstance(a, dict):
            problems.append(f"{name} is not an object")
            continue
        bbox, before = a.get("bbox"), len(problems)
        if not isinstance(bbox, list) or len(bbox) != 4 or not all(_number(v) for v in bbox):
            problems.append(f"{name} has bbox {bbox!r}: it must be [x, y, width, height], 4 numbers")
        if a.get("image_id") not in image_ids:
            problems.append(f"{name} has image_id {a.get('image_id')!r}, which is not in 'images'")
        if a.get("category_id") not in label_of:
            problems.append(f"{name} has category_id {a.get('category_id')!r}, which is not in 'categories' "
                            f"(ids {known_ids})")
        if masks and a.get("image_id") in image_of:
            problem = _segmentation_problem(a.get("segmentation"), image_of[a["image_id"]])
            if problem is not None:
                problems.append(f"{name} {problem}")
        if len(problems) > before:
            continue
        if a.get("iscrowd", 0):
            crowd += 1
        elif bbox[2] <= 0 or bbox[3] <= 0:
            degenerate += 1
        else:
            kept.append({"id": len(kept) + 1, "image_id": a["image_id"], "category_id": label_of[a["category_id"]],
                         "bbox": [float(v) for v in bbox], "iscrowd": 0, "area": float(bbox[2] * bbox[3]),
                         **({"segmentation": a["segmentation"]} if masks else {})})
    _raise(path, problems, "annotations")
    images = [{k: im[k] for k in ("id", "file_name", "width", "height") if k in im} for im in data["images"]]
    cleaned = {"images": images, "annotations": kept,
               "categories": [{"id": label_of[cid], "name": name} for cid, name in categories]}
    return CocoAnnotations(path, cleaned, categories, crowd, degenerate,
                           source={"images": data["images"], "annotations": data["annotations"]})


def image_truths(annotations: CocoAnnotations) -> dict[int, CocoImageTruth]:
    """Every image's ground truth as the file has it, by image id (see the module docstring)."""
    if annotations.source is None:
        raise ValueError(f"{annotations.path}: the file's own entries were not kept; read it with load_annotations")
    category_ids = tuple(cid for cid, _ in annotations.categories)
    per_image: dict[int, list[dict[str, Any]]] = {im["id"]: [] for im in annotations.source["images"]}
    for a in annotations.source["annotations"]:
        per_image[a["image_id"]].append(a)
    return {im["id"]: CocoImageTruth(dict(im), tuple(per_image[im["id"]]), category_ids)
            for im in annotations.source["images"]}
