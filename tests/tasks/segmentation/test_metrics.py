"""Segmentation's metrics: the confusion matrix by hand, absent classes, accumulation, bad labels."""
from __future__ import annotations

import math

import pytest
import torch

from src.tasks.segmentation.metrics import ConfusionMatrix, confusion_matrix


def test_confusion_matrix_with_ignore_index_by_hand() -> None:
    target = torch.tensor([[0, 0, 1, 255], [1, 2, 2, 255]])
    pred = torch.tensor([[0, 1, 1, 2], [1, 2, 0, 0]])
    cm = confusion_matrix(pred, target, 3)
    # rows = truth, columns = prediction; the two 255 pixels are not counted
    assert cm.tolist() == [[1, 1, 0],
                           [0, 2, 0],
                           [1, 0, 1]]
    acc = ConfusionMatrix(3)
    acc.update(pred, target)
    # IoU = tp / (row + col - tp): class0 1/(2+2-1)=1/3, class1 2/(2+3-2)=2/3, class2 1/(2+1-1)=1/2
    iou = acc.iou().tolist()
    assert iou == pytest.approx([1 / 3, 2 / 3, 1 / 2], abs=1e-15)
    assert acc.miou() == pytest.approx((1 / 3 + 2 / 3 + 1 / 2) / 3, abs=1e-15)
    assert acc.pixel_acc() == pytest.approx(4 / 6, abs=1e-15)
    out = acc.compute(["background", "traffic light", "cat"])
    assert set(out) == {"miou", "pixel_acc", "iou_background", "iou_traffic_light", "iou_cat"}


def test_absent_class_is_nan_and_excluded_but_missed_class_counts_zero() -> None:
    acc = ConfusionMatrix(4)
    # class 3 appears nowhere (zero union) -> NaN, excluded; class 2 is in the truth but never
    # predicted -> IoU 0 and it counts in the mean
    acc.update(torch.tensor([0, 1, 1, 0]), torch.tensor([0, 1, 2, 255]))
    iou = acc.iou()
    assert iou[0] == 1.0 and iou[1] == pytest.approx(0.5) and iou[2] == 0.0 and math.isnan(iou[3])
    assert acc.miou() == pytest.approx((1.0 + 0.5 + 0.0) / 3)
    assert acc.pixel_acc() == pytest.approx(2 / 3)


def test_empty_matrix_gives_nan_not_an_error() -> None:
    acc = ConfusionMatrix(2)
    acc.update(torch.tensor([0, 1]), torch.tensor([255, 255]))
    assert math.isnan(acc.miou()) and math.isnan(acc.pixel_acc())


def test_accumulating_batches_equals_one_big_batch() -> None:
    g = torch.Generator().manual_seed(0)
    t = torch.randint(0, 5, (6, 7, 9), generator=g)
    t[t == 4] = 255
    p = torch.randint(0, 5, (6, 7, 9), generator=g)
    whole, parts = ConfusionMatrix(5), ConfusionMatrix(5)
    whole.update(p, t)
    for i in range(6):
        parts.update(p[i], t[i])
    assert torch.equal(whole.mat, parts.mat) and whole.mat.dtype == torch.int64
    assert int(whole.mat.sum()) == int((t != 255).sum())


def test_labels_out_of_range_are_an_error() -> None:
    with pytest.raises(ValueError, match=r"target labels \[7\] are outside \[0, 3\)"):
        confusion_matrix(torch.tensor([0, 1]), torch.tensor([0, 7]), 3)
    with pytest.raises(ValueError, match="wrong number of classes"):
        confusion_matrix(torch.tensor([0, 5]), torch.tensor([0, 1]), 3)
    with pytest.raises(ValueError, match="same shape"):
        confusion_matrix(torch.tensor([0, 1, 2]), torch.tensor([0, 1]), 3)
