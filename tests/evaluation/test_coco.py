"""src/evaluation/coco.py: COCO's ground truth as the file has it, COCO's results format, COCOeval's numbers.

Small hand-made cases whose mAP is known: what COCO's evaluation does with crowd regions, tiny boxes and the
annotations' area, and the two places it differs from pycocotools on the raw file (annotation id 0, missing
keys). The whole path on a COCO-format folder at 1, 2 and 3 processes is tests/tasks/detection/test_evaluation.py.
"""
from __future__ import annotations

import copy
import math

import pytest
import torch

from src.data.coco_annotations import CocoImageTruth
from src.evaluation.coco import STAT_NAMES, box_results, coco_metrics, ground_truth, image_truth

CATEGORIES = (3, 7)  # labels 1 and 2
NAMES = ["background", "cat", "dog"]


def _truth(image_id: int, *annotations: dict) -> CocoImageTruth:
    return CocoImageTruth({"id": image_id, "width": 100, "height": 80}, tuple(annotations), CATEGORIES)


def _ann(ann_id: int, image_id: int, category: int, bbox: list[float], **extra: object) -> dict:
    return {"id": ann_id, "image_id": image_id, "category_id": category, "bbox": bbox,
            "area": bbox[2] * bbox[3], "iscrowd": 0, **extra}


def _prediction(*rows: tuple[list[float], float, int]) -> dict[str, torch.Tensor]:
    """(xyxy box, score, label) rows as a model's output."""
    return {"boxes": torch.tensor([r[0] for r in rows], dtype=torch.float32).reshape(-1, 4),
            "scores": torch.tensor([r[1] for r in rows], dtype=torch.float32),
            "labels": torch.tensor([r[2] for r in rows], dtype=torch.int64)}


def _map(truths: list[CocoImageTruth], predictions: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    results = [r for t, p in zip(truths, predictions) for r in box_results(t, p)]
    return coco_metrics(ground_truth(truths, NAMES), results)


CAT = _ann(11, 5, 3, [10, 10, 20, 20])
CROWD = _ann(12, 5, 3, [50, 10, 40, 40], iscrowd=1)
EXACT = ([10, 10, 30, 30], 0.9, 1)  # CAT, exactly
ON_CROWD = ([55, 15, 85, 45], 0.95, 1)  # inside the crowd region, scoring highest


def test_a_detection_on_a_crowd_region_is_ignored_not_wrong() -> None:
    with_crowd = _map([_truth(5, CAT, CROWD)], [_prediction(EXACT, ON_CROWD)])
    assert with_crowd["map"] == pytest.approx(1.0) and with_crowd["map50"] == pytest.approx(1.0)
    # Dropping the crowd region (what training does) makes the same detection a false positive ahead of the
    # true one: precision 1/2 at every recall, AP 0.5 (COCO's 101-point interpolation).
    without = _map([_truth(5, CAT)], [_prediction(EXACT, ON_CROWD)])
    assert without["map"] == pytest.approx(0.5, abs=0.01)


def test_tiny_and_zero_width_boxes_stay_objects_to_find() -> None:
    tiny = _ann(13, 5, 7, [70.2, 60.1, 0.6, 0.8])
    missed = _map([_truth(5, CAT, tiny)], [_prediction(EXACT)])
    assert missed["map"] == pytest.approx(0.5)  # the cat found (AP 1), the tiny dog not (AP 0)
    zero = _ann(14, 5, 7, [70, 60, 0, 10])
    assert _map([_truth(5, CAT, zero)], [_prediction(EXACT)])["map"] == pytest.approx(0.5)


def test_the_annotations_area_places_objects_in_coco_size_ranges() -> None:
    # A 40 x 40 box is "medium" by its box (1600 px^2) but COCO's area is the segment's: 900 is "small".
    segment = _ann(15, 5, 3, [10, 10, 40, 40], area=900.0)
    metrics = _map([_truth(5, segment)], [_prediction(([10, 10, 50, 50], 0.9, 1))])
    assert metrics["map_small"] == pytest.approx(1.0)
    assert math.isnan(metrics["map_medium"]) and math.isnan(metrics["map_large"])
    assert list(metrics) == list(STAT_NAMES)


def test_ids_are_the_files_and_results_are_cocos_format() -> None:
    truth = _truth(4711, _ann(1, 4711, 7, [1, 2, 3, 4]))
    rows = box_results(truth, _prediction(([1.5, 2.0, 4.25, 6.0], 0.625, 2), ([0, 0, 1, 1], 0.5, 1)))
    assert rows == [{"image_id": 4711, "category_id": 7, "bbox": [1.5, 2.0, 2.75, 4.0], "score": 0.625},
                    {"image_id": 4711, "category_id": 3, "bbox": [0.0, 0.0, 1.0, 1.0], "score": 0.5}]
    with pytest.raises(ValueError, match="label 3, but the data has 2 object classes"):
        box_results(truth, _prediction(([0, 0, 1, 1], 0.5, 3)))
    gt = ground_truth([truth], NAMES)
    assert gt.getImgIds() == [4711] and sorted(gt.getCatIds()) == [3, 7]
    assert gt.loadCats(7)[0]["name"] == "dog"


def test_annotation_id_zero_and_missing_keys_are_evaluated_as_coco_means() -> None:
    """pycocotools on the raw file would count a match with annotation id 0 as a false positive and stop
    (KeyError) at an annotation without area or iscrowd: ids are renumbered, area and iscrowd filled in."""
    bare = {"id": 0, "image_id": 5, "category_id": 3, "bbox": [10, 10, 20, 20]}
    truth = _truth(5, bare)
    assert _map([truth], [_prediction(EXACT)])["map"] == pytest.approx(1.0)
    assert bare == {"id": 0, "image_id": 5, "category_id": 3, "bbox": [10, 10, 20, 20]}, "the dataset's is untouched"
    (ann,) = ground_truth([truth]).dataset["annotations"]
    assert (ann["id"], ann["area"], ann["iscrowd"]) == (1, 400.0, 0)


def test_evaluation_leaves_the_ground_truth_as_it_was() -> None:
    truths = [_truth(5, _ann(11, 5, 3, [10, 10, 20, 20]), _ann(12, 5, 3, [50, 10, 40, 40], iscrowd=1)), _truth(6)]
    before = copy.deepcopy(truths)
    _map(truths, [_prediction(EXACT, ON_CROWD), _prediction()])
    assert truths == before


def test_no_detections_score_zero_and_no_images_are_undefined() -> None:
    assert _map([_truth(5, CAT), _truth(6)], [_prediction(), _prediction()])["map"] == 0.0
    assert all(math.isnan(v) for v in coco_metrics(ground_truth([]), []).values())
    only_empty = _map([_truth(6)], [_prediction(EXACT)])  # no ground truth anywhere: undefined, not 0
    assert math.isnan(only_empty["map"])


def test_targets_without_a_file_become_cocos_ground_truth() -> None:
    """data=shapes_det: image id = dataset index, category id = label, area = the box's, no crowds (unless the
    target says otherwise)."""
    truth = image_truth(3, {"boxes": torch.tensor([[1.0, 2.0, 5.0, 10.0]]), "labels": torch.tensor([2])}, 4)
    assert truth.image == {"id": 3} and truth.category_ids == (1, 2, 3)
    assert truth.annotations == ({"image_id": 3, "category_id": 2, "bbox": [1.0, 2.0, 4.0, 8.0], "area": 32.0,
                                  "iscrowd": 0},)
    crowded = image_truth(4, {"boxes": torch.tensor([[0.0, 0.0, 10.0, 10.0]]), "labels": torch.tensor([1]),
                              "iscrowd": torch.tensor([1]), "area": torch.tensor([60.0])}, 4)
    assert (crowded.annotations[0]["iscrowd"], crowded.annotations[0]["area"]) == (1, 60.0)  # torchvision's keys
    from_file = _truth(5, CAT)
    assert image_truth(0, {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0), "coco": from_file}, 3) is from_file
