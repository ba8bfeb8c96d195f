"""Multi-label classification's evaluator on real gloo groups: map, ap_<class> and loss for world sizes 1, 2, 3 equal
a one-process evaluation bit for bit (tests/evaluation/test_loop.py's harness), the APs equal
scikit-learn's average_precision_score of the same logits, and the export is complete and in dataset order.

101 samples (no world size divides them) in batches of 8: uneven shards, ranks run different numbers of batches.
Class 4 has no positive sample: its AP is NaN and the mean leaves it out.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from src.cpu_threads import fixed_threads
from src.evaluation.loop import evaluate
from src.tasks import get_task
from tests.evaluation.test_loop import loader, same
from tests.support import process_state
from tests.support.gloo import run_on_ranks

pytestmark = pytest.mark.usefixtures("restores_rng")  # tests here seed torch's global generator
# Imported at collection: scikit-learn sets environment variables (KMP_*) when first imported.
sklearn_metrics = pytest.importorskip("sklearn.metrics")

NUM_SAMPLES, NUM_CLASSES, BATCH = 101, 5, 8
CLASS_NAMES = ["a", "b c", "d", "e", "never"]


class MultiLabelData(Dataset):
    """101 random 3x6x6 images; classes 0-3 present where a channel statistic is high, class 4 never."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(4)
        self.x = torch.randn(NUM_SAMPLES, 3, 6, 6, generator=g)
        stats = torch.stack([self.x[:, 0].mean((1, 2)), self.x[:, 1].mean((1, 2)), self.x[:, 2].amax((1, 2)),
                             self.x.mean((1, 2, 3))], dim=1)
        self.y = torch.cat([(stats > stats.median(0).values).float(), torch.zeros(NUM_SAMPLES, 1)], dim=1)

    def __len__(self) -> int:
        return NUM_SAMPLES

    def __getitem__(self, i: int):
        return self.x[i], self.y[i], i


def tiny_tagger() -> nn.Module:
    """Same weights in every process; BN running statistics made non-trivial by a few training forwards."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, NUM_CLASSES))
    with torch.no_grad():
        model(torch.randn(16, 3, 6, 6) + 0.5)
    return model


def evaluate_multilabel(rank: int, world: int, out_dir: str) -> dict:
    """The evaluation with its export; runs in each rank (or in the test)."""
    torch.set_num_threads(1 + rank % 2)  # what each process had before: evaluation must not depend on it
    metrics = evaluate(tiny_tagger(), loader(MultiLabelData(), rank, world, BATCH), get_task("multilabel"), NUM_CLASSES, "cpu",
                       export=Path(out_dir) / "ml", class_names=CLASS_NAMES, threads=1)
    return {"ml": metrics, "threads_after": torch.get_num_threads()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """One process, no process group: the result every world size must reproduce."""
    out = tmp_path_factory.mktemp("reference")
    with process_state.restoring("torch intra-op threads", "torch's global RNG"):
        return evaluate_multilabel(0, 1, str(out)), out


def test_metrics_equal_scikit_learn_on_the_same_logits(reference: tuple[dict, Path]) -> None:
    res, _ = reference
    model, data = tiny_tagger().eval(), MultiLabelData()
    with fixed_threads(1), torch.inference_mode():  # the evaluation's batches and threads: its very logits
        logits = torch.cat([model(x) for x, _, _ in loader(data, 0, 1, BATCH)]).double().numpy()
    truth = data.y.numpy()
    metrics = res["ml"]
    assert set(metrics) == {"map", "loss", "ap_a", "ap_b_c", "ap_d", "ap_e", "ap_never"}
    expected = [sklearn_metrics.average_precision_score(truth[:, k], logits[:, k]) for k in range(4)]
    assert [metrics[f"ap_{n}"] for n in ("a", "b_c", "d", "e")] == pytest.approx(expected, rel=1e-12)
    assert math.isnan(metrics["ap_never"]) and metrics["map"] == pytest.approx(np.mean(expected), rel=1e-12)
    bce = nn.functional.binary_cross_entropy_with_logits(torch.from_numpy(logits), data.y.double())
    assert metrics["loss"] == pytest.approx(float(bce), rel=1e-6)  # float32 logits' losses, summed in another order


@pytest.mark.parametrize("world", [1, 2, 3])
def test_distributed_evaluation_equals_one_process(world: int, reference: tuple[dict, Path], tmp_path: Path) -> None:
    ref, ref_dir = reference
    for rank, res in enumerate(run_on_ranks(world, evaluate_multilabel, str(tmp_path))):
        assert same(res["ml"], ref["ml"]), (rank, res["ml"], ref["ml"])
        assert res["threads_after"] == 1 + rank % 2, "the process's thread count is restored"
    probs = np.load(tmp_path / "ml" / "probabilities.npy")
    assert probs.shape == (NUM_SAMPLES, NUM_CLASSES) and probs.dtype == np.float32
    np.testing.assert_array_equal(probs, np.load(ref_dir / "ml" / "probabilities.npy"))
    csv = (tmp_path / "ml" / "predictions.csv").read_text().splitlines()
    assert csv[0] == "index,labels,prob_a,prob_b c,prob_d,prob_e,prob_never" and len(csv) == NUM_SAMPLES + 1
    assert [int(line.split(",")[0]) for line in csv[1:]] == list(range(NUM_SAMPLES))
