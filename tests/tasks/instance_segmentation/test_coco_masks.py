"""data=coco's masks: the training targets hold the masks pycocotools decodes from the file (polygons, compressed
run-length encodings), a missing or unreadable one is named at build; and COCO's mask evaluation on the file's
own ground truth (polygons, crowd regions as uncompressed RLE, ids not contiguous, images without objects): the
task's ground truth (instance_truth of the file's CocoImageTruth, as a data=coco evaluation target carries it)
and its segm results give pycocotools' COCOeval run directly on the json and the results file, within 1e-6."""
from __future__ import annotations

import contextlib
import copy
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision import tv_tensors
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from src.config import data_config
from src.data.coco_annotations import image_truths, load_annotations
from src.data.registry import dataset_entry
from src.evaluation.coco import coco_metrics, ground_truth
from src.tasks import get_task
from src.tasks.instance_segmentation.masks import encode, instance_truth, mask_results
from tests.support.coco_files import VARIED_CLASS_NAMES, varied_coco, with_segmentations, write_coco_folder, write_coco_split


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
    data = with_segmentations(varied_coco())
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


def _coco_splits(root: Path, task: str):
    cfg = data_config(name="coco", root=str(root), train_split="train", val_split="val")
    cfg.validate()
    return dataset_entry("coco").builder(cfg, get_task(task).data)


def test_data_coco_gives_mask_rcnn_the_files_masks(tmp_path: Path) -> None:
    """Training targets: per kept object (no crowd, no empty box) the mask pycocotools decodes from its polygons or
    run-length encoding; the same folder built for detection has no masks."""
    data = with_segmentations(varied_coco())
    root = write_coco_folder(tmp_path, data, data)
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(root / "annotations" / "instances_train.json"))
    splits = _coco_splits(root, "instance_segmentation")
    forms = set()
    for i, image_id in enumerate(splits.train.image_ids):
        image, target = splits.train[i]
        kept = [a for a in gt.imgToAnns[image_id] if not a["iscrowd"] and a["bbox"][2] > 0 and a["bbox"][3] > 0]
        forms |= {type(a["segmentation"]).__name__ for a in kept}
        masks = target["masks"]
        assert isinstance(masks, tv_tensors.Mask) and masks.dtype == torch.uint8
        assert tuple(masks.shape) == (len(kept), *image.shape[-2:]) == (len(target["boxes"]), *image.shape[-2:])
        expected = np.stack([gt.annToMask(a) for a in kept]) if kept else np.zeros((0, *image.shape[-2:]))
        assert np.array_equal(masks.numpy(), expected), image_id
        assert set(splits.val[i][1]) == {"boxes", "labels", "masks", "coco"}
    assert forms == {"list", "dict"}  # polygons and a compressed run-length encoding among the training masks
    assert "masks" not in _coco_splits(root, "detection").train[0][1]


@pytest.mark.parametrize("spoil, message", [
    (lambda a, im: a.pop("segmentation"), "has no 'segmentation' (instance segmentation needs each object's mask"),
    (lambda a, im: a.update(segmentation=[[1, 2, 3, 4]]), "has a 'segmentation' polygon that is not [x1, y1, x2, y2, ...] with at least 3"),
    (lambda a, im: a.update(segmentation={"size": [im["height"] + 1, im["width"]], "counts": "abc"}),
     "has a run-length 'segmentation' of size [73, 48], but its image is [72, 48]"),
    (lambda a, im: a.update(segmentation={"counts": "abc"}), "has a run-length 'segmentation' whose 'size' is None, not [height, width]"),
])
def test_a_missing_or_unreadable_mask_is_named_at_build(tmp_path: Path, spoil, message: str) -> None:
    data = with_segmentations(varied_coco())
    spoilt = copy.deepcopy(data)
    annotation = spoilt["annotations"][3]
    spoil(annotation, next(im for im in spoilt["images"] if im["id"] == annotation["image_id"]))
    root = write_coco_folder(tmp_path, spoilt, data)
    with pytest.raises(ValueError, match=re.escape(f"annotations[3] (id {annotation['id']}) {message}")):
        _coco_splits(root, "instance_segmentation")
    _coco_splits(root, "detection")  # boxes are all detection reads
