"""COCO's mask evaluation on a COCO file's own ground truth: polygons, crowd regions as uncompressed RLE, ids not
contiguous, images without objects. The task's ground truth (instance_truth of the file's CocoImageTruth, as a
data=coco evaluation target carries it) and its segm results give pycocotools' COCOeval run directly on the json
and the results file, within 1e-6."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from pycocotools import mask as coco_mask
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from src.data.coco_annotations import image_truths, load_annotations
from src.tasks.coco_evaluation import coco_metrics, ground_truth
from src.tasks.instance_segmentation.masks import encode, instance_truth, mask_results
from tests.support.coco_files import VARIED_CLASS_NAMES, varied_coco, write_coco_split


def _with_segmentations(data: dict) -> dict:
    """varied_coco() with COCO's segmentation of every annotation: an octagon polygon inside each box, and each
    crowd region as an uncompressed RLE of its box (COCO's form for crowds), its area the RLE's."""
    sizes = {im["id"]: (im["height"], im["width"]) for im in data["images"]}
    for a in data["annotations"]:
        x, y, w, h = a["bbox"]
        if a["iscrowd"]:
            height, width = sizes[a["image_id"]]
            region = np.zeros((height, width), dtype=np.uint8, order="F")
            region[int(y):int(y + h), int(x):int(x + w)] = 1
            rle = coco_mask.encode(region)
            a["segmentation"] = {"size": [height, width], "counts": _uncompressed(region)}
            a["area"] = float(coco_mask.area(rle))
        else:
            cut_x, cut_y = w / 4, h / 4
            a["segmentation"] = [[x + cut_x, y, x + w - cut_x, y, x + w, y + cut_y, x + w, y + h - cut_y,
                                  x + w - cut_x, y + h, x + cut_x, y + h, x, y + h - cut_y, x, y + cut_y]]
    return data


def _uncompressed(region: np.ndarray) -> list[int]:
    """Run lengths of a binary mask in column-major order, starting with zeros (COCO's uncompressed RLE)."""
    flat = region.flatten(order="F")
    changes = np.flatnonzero(np.diff(np.concatenate([[0], flat, [1 - flat[-1]]])))
    return np.diff(np.concatenate([[0], changes])).tolist()


def _predictions(gt: COCO, truth_ids: list[int]) -> dict[int, dict]:
    """Per image: each annotation's mask (crowds included) shifted by 0-2 px, a stray square, scores falling."""
    labels = {cid: k for k, cid in enumerate(sorted(gt.getCatIds()), start=1)}
    out = {}
    for image_id in truth_ids:
        info = gt.imgs[image_id]
        masks, classes = [], []
        for k, ann in enumerate(gt.imgToAnns[image_id]):
            masks.append(np.roll(gt.annToMask(ann), k % 3, axis=1))
            classes.append(labels[ann["category_id"]])
        stray = np.zeros((info["height"], info["width"]), dtype=np.uint8)
        stray[:6, :6] = 1
        masks.append(stray)
        classes.append(1)
        n = len(masks)
        out[image_id] = {"rles": encode(torch.from_numpy(np.stack(masks)).bool()),
                         "scores": torch.linspace(0.9, 0.3, n), "labels": torch.tensor(classes)}
    return out


def test_mask_map_is_cocoeval_on_the_original_json(tmp_path: Path) -> None:
    data = _with_segmentations(varied_coco())
    ann_file = write_coco_split(tmp_path, "val", data)
    truths = image_truths(load_annotations(ann_file, tmp_path / "val"))
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(ann_file))
    ids = [im["id"] for im in data["images"]]
    predictions = _predictions(gt, ids)
    # What the evaluator does: each image's truth as its evaluation target carries it, in dataset order.
    ordered = [instance_truth(i, {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0), "coco": truths[image_id]}, 4)
               for i, image_id in enumerate(sorted(ids))]
    results = [r for t in ordered for r in mask_results(t, predictions[t.image["id"]])]
    ours = coco_metrics(ground_truth(ordered, VARIED_CLASS_NAMES), results, "segm")
    (tmp_path / "segm.json").write_text(json.dumps(results))
    with contextlib.redirect_stdout(io.StringIO()):
        direct = COCOeval(gt, gt.loadRes(str(tmp_path / "segm.json")), "segm")
        direct.evaluate()
        direct.accumulate()
        direct.summarize()
    assert [ours[k] for k in ("map", "map50", "map75")] == pytest.approx(direct.stats[:3].tolist(), abs=1e-6)
    assert 0.2 < ours["map"] < ours["map50"] < 1
    # The crowd regions are ignore regions: without them, the masks found on them are false positives.
    no_crowd = [t.__class__(t.image, tuple(a for a in t.annotations if not a["iscrowd"]), t.category_ids)
                for t in ordered]
    assert coco_metrics(ground_truth(no_crowd, VARIED_CLASS_NAMES), results, "segm")["map"] < ours["map"] - 0.01
