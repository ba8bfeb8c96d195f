"""Average precision per class, and their mean (mAP), as scikit-learn's average_precision_score computes them.

AP = sum over the distinct scores, from the highest, of (R_n - R_{n-1}) * P_n, where P_n and R_n are the precision
and recall of calling every sample scoring at least the n-th distinct score positive: the area under the
precision-recall curve without interpolation. Ties count together (one threshold per distinct score). Computed in
float64 on the CPU from the gathered scores in dataset order, so every rank, and every world size, gets the same
bits. (scikit-learn is not a dependency for one small function; tests/tasks/multilabel/test_metrics.py checks this
against it.)
"""
from __future__ import annotations

import math

import numpy as np


def average_precision(scores: np.ndarray, truth: np.ndarray) -> float:
    """AP of one class: `scores` [N] (any monotone scores: logits or probabilities), `truth` [N] (1 = positive);
    NaN when the class has no positive sample (its AP is undefined)."""
    scores, truth = np.asarray(scores, dtype=np.float64), np.asarray(truth, dtype=np.float64)
    positives = float(truth.sum())
    if positives == 0:
        return math.nan
    order = np.argsort(-scores, kind="stable")
    scores, truth = scores[order], truth[order]
    last = np.r_[np.flatnonzero(np.diff(scores)), scores.size - 1]  # the last sample of each distinct score
    tps = np.cumsum(truth)[last]
    precision = tps / (last + 1)
    recall = tps / positives
    return float(np.sum(np.diff(recall, prepend=0.0) * precision))


def average_precisions(scores: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """AP of each class: `scores` and `truth` [N, K] -> float64 [K] (NaN for a class without positives)."""
    return np.array([average_precision(scores[:, k], truth[:, k]) for k in range(scores.shape[1])], dtype=np.float64)


def mean_average_precision(aps: np.ndarray) -> float:
    """The mean of the classes' APs over the classes that have positives (NaN when none has)."""
    defined = aps[~np.isnan(aps)]
    return float(defined.mean()) if defined.size else math.nan
