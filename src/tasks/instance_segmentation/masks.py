"""Masks in COCO's form: run-length encoded (pycocotools.mask), for the ground truth, the results COCOeval reads
and predict.py's JSON.

A mask is kept as COCO's compressed RLE {"size": [height, width], "counts": str}: a few hundred bytes where the
binary mask is H x W, the form COCO's files and results have, and what COCOeval's "segm" evaluation compares.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

import numpy as np
import torch

from src.data.coco_annotations import COCO_TRUTH_KEY, CocoImageTruth
from src.evaluation.coco import image_truth

MASK_THRESHOLD = 0.5  # a pixel belongs to a predicted instance when its mask probability exceeds this (COCO's)

Rle = dict[str, Any]  # {"size": [h, w], "counts": str}


def encode(masks: torch.Tensor) -> list[Rle]:
    """Binary masks [N, H, W] (bool or 0/1) -> N compressed RLEs with str counts (JSON-ready)."""
    # Imported here: every command's config imports each task, and the GPU node's bundle carries no pycocotools.
    from pycocotools import mask as coco_mask

    binary = np.asfortranarray(masks.detach().cpu().to(torch.uint8).numpy().transpose(1, 2, 0))
    rles = coco_mask.encode(binary) if len(masks) else []
    return [{"size": [int(s) for s in r["size"]], "counts": r["counts"].decode("ascii")} for r in rles]


def decode(rles: list[Rle], height: int, width: int) -> torch.Tensor:
    """Compressed RLEs -> bool masks [N, height, width]."""
    from pycocotools import mask as coco_mask

    if not rles:
        return torch.zeros(0, height, width, dtype=torch.bool)
    return torch.from_numpy(coco_mask.decode([{**r, "counts": r["counts"].encode("ascii")} for r in rles])
                            ).permute(2, 0, 1).bool()


def binarise(probabilities: torch.Tensor) -> torch.Tensor:
    """The model's mask probabilities [N, 1, H, W] -> bool [N, H, W] (MASK_THRESHOLD)."""
    return probabilities.detach().reshape(len(probabilities), *probabilities.shape[-2:]) > MASK_THRESHOLD


def instance_truth(index: int, target: Mapping[str, Any], num_classes: int) -> CocoImageTruth:
    """One evaluated image's COCO ground truth with masks: its file's (target["coco"]: "segmentation" as the file
    has it), else image_truth's from the boxes and labels with each annotation's "segmentation" the RLE of its
    target mask and "area" the mask's pixel count (COCO's area is the segment's), and the image's size."""
    truth = image_truth(index, target, num_classes)
    if target.get(COCO_TRUTH_KEY) is not None:
        return truth
    masks = torch.as_tensor(target["masks"]).as_subclass(torch.Tensor)
    rles = encode(masks.bool())
    areas = masks.reshape(len(masks), -1).bool().sum(1).tolist()
    if len(rles) != len(truth.annotations):
        raise ValueError(f"image {index}: {len(truth.annotations)} boxes but {len(rles)} masks in its target")
    height, width = masks.shape[-2:]
    annotations = tuple({**a, "segmentation": rle, "area": float(area)}
                        for a, rle, area in zip(truth.annotations, rles, areas))
    return replace(truth, image={**truth.image, "height": int(height), "width": int(width)}, annotations=annotations)


def mask_results(truth: CocoImageTruth, prediction: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One image's instances ({"rles", "scores", "labels" 1..K}) in COCO's results format for "segm":
    {"image_id", "category_id", "segmentation": RLE, "score"}, the file's ids, in the model's order."""
    ids, image_id = truth.category_ids, truth.image["id"]
    results = []
    for rle, score, label in zip(prediction["rles"], prediction["scores"].tolist(), prediction["labels"].tolist()):
        if not 1 <= label <= len(ids):
            raise ValueError(f"an instance of image {image_id} has label {label}, but the data has {len(ids)} object "
                             f"classes (labels 1..{len(ids)}): was the model built for other data?")
        results.append({"image_id": image_id, "category_id": ids[label - 1], "segmentation": dict(rle),
                        "score": score})
    return results
