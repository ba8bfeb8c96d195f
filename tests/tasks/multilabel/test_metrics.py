"""Average precision as scikit-learn's average_precision_score computes it (scikit-learn: test-only), ties and
classes without positives included."""
from __future__ import annotations

import math

import numpy as np
import pytest

from src.tasks.multilabel.metrics import average_precision, average_precisions, mean_average_precision

sklearn_metrics = pytest.importorskip("sklearn.metrics")


def test_a_small_case_by_hand() -> None:
    # Scores 0.9 (neg), 0.5 (pos), 0.5 (neg), 0.2 (pos): thresholds 0.9 -> P 0 R 0; 0.5 -> P 1/3 R 1/2; 0.2 -> P 2/4 R 1.
    assert average_precision(np.array([0.5, 0.5, 0.2, 0.9]), np.array([1, 0, 1, 0])) == pytest.approx(
        0.5 * (1 / 3) + 0.5 * 0.5, abs=1e-15)
    assert average_precision(np.array([3.0, 2.0, 1.0]), np.array([1, 1, 0])) == 1.0


def test_equals_scikit_learn_with_ties_and_every_class() -> None:
    rng = np.random.default_rng(0)
    truth = (rng.random((257, 7)) < np.linspace(0.05, 0.7, 7)).astype(np.float64)
    scores = truth * rng.normal(1.0, 1.0, truth.shape) + rng.normal(0.0, 1.0, truth.shape)
    scores[:, 3] = np.round(scores[:, 3], 1)  # many ties: one threshold per distinct score
    scores[:, 5] = 0.25  # every sample tied: AP = the positives' share
    aps = average_precisions(scores, truth)
    expected = [sklearn_metrics.average_precision_score(truth[:, k], scores[:, k]) for k in range(7)]
    # The same sum in another order (scikit-learn sums the reversed curve, pairwise): equal up to rounding.
    np.testing.assert_allclose(aps, expected, rtol=1e-12, atol=0)
    assert aps[5] == pytest.approx(truth[:, 5].mean(), rel=1e-12)
    assert mean_average_precision(aps) == pytest.approx(
        sklearn_metrics.average_precision_score(truth, scores, average="macro"), rel=1e-12)


def test_a_class_without_positives_is_nan_and_left_out_of_the_mean() -> None:
    truth = np.array([[1, 0], [0, 0], [1, 0]], dtype=np.float64)
    scores = np.array([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3]])
    aps = average_precisions(scores, truth)
    assert aps[0] == 1.0 and math.isnan(aps[1])  # scikit-learn says 0 with a warning: undefined, not zero
    assert mean_average_precision(aps) == 1.0 and math.isnan(mean_average_precision(np.array([math.nan])))
