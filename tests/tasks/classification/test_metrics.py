"""Classification's metrics: top-k hits by hand."""
from __future__ import annotations

import math

import pytest
import torch

from src.tasks.classification.metrics import topk_accuracy, topk_correct


def test_topk_by_hand() -> None:
    logits = torch.tensor([
        [0.1, 0.5, 0.2, 0.9, 0.0, 0.3],  # order 3,1,5,2,0,4
        [0.9, 0.1, 0.2, 0.3, 0.4, 0.5],  # order 0,5,4,3,2,1
        [0.0, 0.0, 1.0, 0.0, 0.0, 0.0],  # 2 first
        [0.6, 0.5, 0.4, 0.3, 0.2, 0.1],  # order 0,1,2,3,4,5
    ])
    targets = torch.tensor([3, 2, 1, 5])
    # sample 0: top-1 hit; 1: target 2 ranks 5th -> top-5 hit only; 2 (ties) is not asserted;
    # 3: target 5 ranks last -> miss
    hits = topk_correct(logits, targets, (1, 5))
    assert hits[0].tolist() == [True, True]
    assert hits[1].tolist() == [False, True]
    assert hits[3].tolist() == [False, False]
    top1, top5 = topk_accuracy(logits[[0, 1, 3]], targets[[0, 1, 3]], (1, 5))
    assert top1 == pytest.approx(100 / 3) and top5 == pytest.approx(200 / 3)


def test_topk_with_fewer_classes_than_k() -> None:
    logits = torch.tensor([[0.2, 0.8, 0.0], [0.9, 0.05, 0.05]])
    targets = torch.tensor([2, 0])
    assert topk_accuracy(logits, targets, (1, 5)) == [50.0, 100.0]  # top-5 of 3 classes: always a hit
    assert all(math.isnan(v) for v in topk_accuracy(logits[:0], targets[:0]))
