"""Exact distributed evaluation on real gloo groups: metrics and exports for world sizes 1, 2, 3 equal a
one-process evaluation, bit for bit (each task's own evaluator: tests/tasks/<task>/; classification's here, the
default).

The validation set is sized so that no world size divides it (101 classification samples), so the shards are
uneven and ranks run different numbers of batches. Everything is compared exactly (==, NaN == NaN), the float loss
too: the batches are fixed blocks of dataset indices (EvalBatchSampler) and every rank evaluates with one CPU
thread whatever it had before (ranks start with 1 or 2 here, as torchrun's defaults would differ), so each
sample's logits are the same bits at any world size, and the evaluators reduce them in dataset order.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from src.data.samplers import EvalBatchSampler
from src.evaluation.loop import evaluate
from src.tasks import get_task
from tests.support import process_state
from tests.support.gloo import run_on_ranks

pytestmark = pytest.mark.usefixtures("restores_rng")  # tests here seed torch's global generator

NUM_CLS_SAMPLES, NUM_CLASSES = 101, 7


class ClsData(Dataset):
    """101 random 3x6x6 images with labels that a linear probe partly predicts."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(NUM_CLS_SAMPLES, 3, 6, 6, generator=g)
        self.y = (self.x[:, 0].mean((1, 2)) * 6).long().clamp(-3, 3) + 3  # 0..6

    def __len__(self) -> int:
        return NUM_CLS_SAMPLES

    def __getitem__(self, i: int):
        return self.x[i], int(self.y[i]), i


def tiny_classifier() -> nn.Module:
    """Same weights in every process; BN running stats made non-trivial by a few training forwards."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(8, NUM_CLASSES))
    with torch.no_grad():
        model(torch.randn(16, 3, 6, 6) + 0.5)
    return model


def loader(dataset: Dataset, rank: int, world: int, batch_size: int) -> DataLoader:
    """An exact-evaluation loader: the data package's fixed blocks of indices, whole blocks per rank, no padding."""
    return DataLoader(dataset, batch_sampler=EvalBatchSampler(len(dataset), batch_size, rank, world))


def evaluate_classification(rank: int, world: int, out_dir: str) -> dict:
    """Classification evaluation with its export; runs in each rank (or in the test)."""
    torch.set_num_threads(1 + rank % 2)  # what each process had before: evaluation must not depend on it
    model = tiny_classifier()
    model.train()  # evaluate() must switch to eval and back
    metrics = evaluate(model, loader(ClsData(), rank, world, 8), get_task("classification"), NUM_CLASSES, "cpu",
                       export=Path(out_dir) / "cls", threads=1)
    return {"cls": metrics, "training_after": model.training, "threads_after": torch.get_num_threads()}


def same(a: dict[str, float], b: dict[str, float]) -> bool:
    """Every metric equal bit for bit (NaN equal to NaN)."""
    return a.keys() == b.keys() and all((math.isnan(a[k]) and math.isnan(b[k])) or a[k] == b[k] for k in a)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """One process, no process group: the result every world size must reproduce (on one thread, as each rank)."""
    out = tmp_path_factory.mktemp("reference")
    with process_state.restoring("torch intra-op threads", "torch's global RNG"):
        return evaluate_classification(0, 1, str(out)), out


def test_reference_metrics_are_plausible(reference: tuple[dict, Path]) -> None:
    res, _ = reference
    assert set(res["cls"]) == {"loss", "top1", "top5"}
    assert 0 < res["cls"]["top1"] <= res["cls"]["top5"] <= 100
    # k / 101 in percent: the accuracies are counts of whole samples
    assert round(res["cls"]["top1"] * NUM_CLS_SAMPLES / 100, 9).is_integer()
    assert res["training_after"] is True


@pytest.mark.parametrize("world", [1, 2, 3])
def test_distributed_evaluation_equals_one_process(world: int, reference: tuple[dict, Path], tmp_path: Path) -> None:
    ref, ref_dir = reference
    results = run_on_ranks(world, evaluate_classification, str(tmp_path))
    for rank, res in enumerate(results):
        assert same(res["cls"], ref["cls"]), (rank, res["cls"], ref["cls"])
        assert res["training_after"] is True
        assert res["threads_after"] == 1 + rank % 2, "the process's thread count is restored"

    # Exports: complete, in dataset order, and the same predictions as one process.
    preds = np.load(tmp_path / "cls" / "predictions.npy")
    assert preds.shape == (NUM_CLS_SAMPLES,)
    np.testing.assert_array_equal(preds, np.load(ref_dir / "cls" / "predictions.npy"))
    csv = (tmp_path / "cls" / "predictions.csv").read_text().splitlines()
    assert csv[0] == "index,prediction" and len(csv) == NUM_CLS_SAMPLES + 1
    assert [int(line.split(",")[0]) for line in csv[1:]] == list(range(NUM_CLS_SAMPLES))


def test_custom_loss_fn_reduced_or_not_gives_the_same_mean() -> None:
    model, data = tiny_classifier(), ClsData()
    unreduced = evaluate(model, loader(data, 0, 1, 101), get_task("classification"), NUM_CLASSES, "cpu",
                         loss_fn=lambda lo, t: nn.functional.cross_entropy(lo, t, reduction="none") * 2)
    reduced = evaluate(model, loader(data, 0, 1, 10), get_task("classification"), NUM_CLASSES, "cpu",
                       loss_fn=lambda lo, t: nn.functional.cross_entropy(lo, t) * 2)
    plain = evaluate(model, loader(data, 0, 1, 10), get_task("classification"), NUM_CLASSES, "cpu")
    # batch means weighted by batch size: the same mean up to float rounding (1e-6 relative)
    assert reduced["loss"] == pytest.approx(unreduced["loss"], rel=1e-6)
    assert unreduced["loss"] == pytest.approx(2 * plain["loss"], rel=1e-6)


def test_duplicated_or_missing_samples_are_an_error() -> None:
    data = ClsData()
    twice = DataLoader(data, batch_size=8, sampler=[0, 1, 2, 2] + list(range(3, 100)))  # 101 items, one twice
    with pytest.raises(RuntimeError, match="more than one rank"):
        evaluate(tiny_classifier(), twice, get_task("classification"), NUM_CLASSES, "cpu")
    short = DataLoader(data, batch_size=8, sampler=list(range(50)))
    with pytest.raises(RuntimeError, match="50 of 101"):
        evaluate(tiny_classifier(), short, get_task("classification"), NUM_CLASSES, "cpu")
    no_index = DataLoader(torch.utils.data.TensorDataset(data.x, data.y), batch_size=8)
    with pytest.raises(ValueError, match="images, targets, indices"):
        evaluate(tiny_classifier(), no_index, get_task("classification"), NUM_CLASSES, "cpu")


def test_bf16_autocast_runs_and_stays_close() -> None:
    model, data = tiny_classifier(), ClsData()
    fp32 = evaluate(model, loader(data, 0, 1, 32), get_task("classification"), NUM_CLASSES, "cpu")
    bf16 = evaluate(model, loader(data, 0, 1, 32), get_task("classification"), NUM_CLASSES, "cpu", amp="bf16")
    # bf16 has ~3 significant digits; the mean loss of this tiny model moves by far less than 5%
    assert bf16["loss"] == pytest.approx(fp32["loss"], rel=5e-2)
