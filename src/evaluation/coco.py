"""COCO's evaluation, exactly: pycocotools' COCOeval on COCO's own ground truth and COCO's results format.

What torchvision's detection references and detectron2 run, and what published COCO numbers are. The ground
truth is each image's as its file has it (CocoImageTruth, src/data/coco_annotations.py, carried by the
evaluation targets of data=coco): crowd regions stay and are COCO's ignore regions (a detection on one is
neither right nor wrong), no box is clamped or dropped for being small, the annotations' `area` places an
object in the small/medium/large ranges, and image and category ids are the file's. Datasets without a
file (data=shapes_det) get the same from their targets' boxes and labels (image_truth: image id = dataset
index, category id = label; the target's "area" and "iscrowd" where it has them, else the box's area and no
crowds), so every detection dataset takes one path.

What differs from running COCOeval on the file itself, and why:
- annotation ids are renumbered 1..N in file order: COCOeval counts a match with an annotation of id 0 as a
  false positive (it tests the matched id for truth) and its index needs unique ids; the file's ids are
  read by nothing else, and the order (which decides ties) is kept;
- an annotation without `area` gets its box's width x height, and one without `iscrowd` 0 (COCOeval
  would stop with a KeyError).

Use (rank 0, on every evaluated image; the instance-segmentation task passes iou_type="segm" with
results that hold RLE "segmentation" masks):

    truths = [image_truth(index, target, num_classes) for ...]        # one CocoImageTruth per image
    results = [r for truth, p in ... for r in box_results(truth, p)]   # COCO's results format
    metrics = coco_metrics(ground_truth(truths, class_names), results, iou_type="bbox")  # STAT_NAMES
"""
from __future__ import annotations

import contextlib
import io
import math
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

import torch

from src.data.coco_annotations import COCO_TRUTH_KEY, CocoImageTruth

if TYPE_CHECKING:
    from pycocotools.coco import COCO

# COCOeval.stats in its order (summarize()): AP@[.5:.95], AP@.5, AP@.75, AP small/medium/large, AR with
# 1/10/100 detections per image, AR small/medium/large (100 detections).
STAT_NAMES = ("map", "map50", "map75", "map_small", "map_medium", "map_large",
              "mar1", "mar10", "mar100", "mar_small", "mar_medium", "mar_large")


def image_truth(index: int, target: Mapping[str, Any], num_classes: int) -> CocoImageTruth:
    """One evaluated image's COCO ground truth: its file's (target["coco"]), else built from the target's
    "boxes" (xyxy) and "labels" with image id `index` and category ids 1..num_classes-1 (the labels); a
    target's "iscrowd" and "area" (torchvision's detection targets have them) are used where present, else
    no crowds and the boxes' areas."""
    truth = target.get(COCO_TRUTH_KEY)
    if truth is not None:
        return truth
    boxes = _column(target["boxes"]).reshape(-1, 4).tolist()
    labels = _column(target["labels"]).long().tolist()
    count = len(labels)
    crowds = _column(target["iscrowd"]).long().tolist() if "iscrowd" in target else [0] * count
    areas = (_column(target["area"]).tolist() if "area" in target else
             [(x2 - x1) * (y2 - y1) for x1, y1, x2, y2 in boxes])
    annotations = tuple({"image_id": index, "category_id": label, "bbox": [x1, y1, x2 - x1, y2 - y1], "area": area,
                         "iscrowd": crowd}
                        for (x1, y1, x2, y2), label, area, crowd in zip(boxes, labels, areas, crowds))
    return CocoImageTruth({"id": index}, annotations, tuple(range(1, num_classes)))


def _column(values: Any) -> torch.Tensor:
    """A target's tensor (or list) as a flat float64 or int64 CPU tensor."""
    tensor = torch.as_tensor(values).detach().cpu().as_subclass(torch.Tensor)
    return (tensor if not tensor.is_floating_point() else tensor.double()).reshape(-1)


def ground_truth(truths: Sequence[CocoImageTruth], class_names: Optional[Sequence[str]] = None) -> COCO:
    """pycocotools' index of these images and their annotations (see the module docstring), with the
    categories of `category_ids`, named class_names[k] for label k when given."""
    from pycocotools.coco import COCO

    category_ids = truths[0].category_ids if truths else ()
    if any(t.category_ids != category_ids for t in truths):
        raise ValueError("the evaluated images do not share one category list: they must come from one dataset")
    annotations = []
    for truth in truths:
        for original in truth.annotations:
            # A copy: COCOeval writes into its ground truth ("ignore"), which must not reach the dataset's.
            ann = {**original, "id": len(annotations) + 1}
            ann.setdefault("iscrowd", 0)
            if not _number(ann.get("area")):
                ann["area"] = float(ann["bbox"][2]) * float(ann["bbox"][3])
            annotations.append(ann)
    names = list(class_names or [])
    categories = [{"id": cid, "name": names[k] if k < len(names) else str(cid)}
                  for k, cid in enumerate(category_ids, start=1)]
    coco = COCO()
    coco.dataset = {"images": [dict(t.image) for t in truths], "annotations": annotations, "categories": categories}
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints "creating index..."
        coco.createIndex()
    return coco


def box_results(truth: CocoImageTruth, prediction: Mapping[str, torch.Tensor]) -> list[dict[str, Any]]:
    """One image's detections ({"boxes" xyxy, "scores", "labels" 1..K}) in COCO's results format:
    {"image_id", "category_id", "bbox": [x, y, width, height], "score"}, the file's ids, in the model's order."""
    boxes = prediction["boxes"].detach().cpu().reshape(-1, 4).tolist()
    scores = prediction["scores"].detach().cpu().reshape(-1).tolist()
    labels = prediction["labels"].detach().cpu().reshape(-1).tolist()
    ids, image_id = truth.category_ids, truth.image["id"]
    results = []
    for (x1, y1, x2, y2), score, label in zip(boxes, scores, labels):
        if not 1 <= label <= len(ids):
            raise ValueError(f"a detection of image {image_id} has label {label}, but the data has {len(ids)} object "
                             f"classes (labels 1..{len(ids)}): was the model built for other data?")
        results.append({"image_id": image_id, "category_id": ids[label - 1], "bbox": [x1, y1, x2 - x1, y2 - y1],
                        "score": score})
    return results


def coco_metrics(gt: COCO, results: Sequence[Mapping[str, Any]], iou_type: str = "bbox") -> dict[str, float]:
    """COCOeval's twelve summary numbers by name (STAT_NAMES), 0-1; an undefined one (COCOeval's -1: no ground
    truth in its range) is NaN, and all are NaN without images."""
    from pycocotools.cocoeval import COCOeval

    if not gt.getImgIds():
        return {name: math.nan for name in STAT_NAMES}
    with contextlib.redirect_stdout(io.StringIO()):  # COCOeval prints its progress and its table
        # Copies: loadRes adds "id", "area", "iscrowd" (and a box's polygon) to what it reads.
        detections = gt.loadRes([dict(r) for r in results]) if results else _no_results(gt)
        evaluation = COCOeval(gt, detections, iou_type)
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    return {name: (math.nan if value < 0 else float(value)) for name, value in zip(STAT_NAMES, evaluation.stats)}


def _no_results(gt: COCO) -> COCO:
    """An empty results set (loadRes refuses an empty list): every object is missed."""
    from pycocotools.coco import COCO

    empty = COCO()
    empty.dataset = {"images": gt.dataset["images"], "categories": gt.dataset["categories"], "annotations": []}
    with contextlib.redirect_stdout(io.StringIO()):
        empty.createIndex()
    return empty


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
