"""Exact distributed evaluation on real gloo groups: metrics and exports for world sizes 1, 2, 3 equal a
one-process evaluation, bit for bit.

The validation sets are sized so that no world size divides them (101 classification samples, 13
segmentation images of different sizes), so the shards are uneven and ranks run different numbers of
batches. Everything is compared exactly (==, NaN == NaN), the float loss too: the batches are fixed blocks
of dataset indices (EvalBatchSampler) and every rank evaluates with one CPU thread whatever it had before
(ranks start with 1 or 2 here, as torchrun's defaults would differ), so each sample's logits are the same
bits at any world size, and the evaluators reduce them in dataset order.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset

from src.data.samplers import EvalBatchSampler
from src.engine.evaluation.evaluator import evaluate
from src.tasks.exports import mask_filename
from tests.support.gloo import run_on_ranks

NUM_CLS_SAMPLES, NUM_CLASSES = 101, 7
NUM_SEG_IMAGES, NUM_SEG_CLASSES = 13, 5  # class 4 never occurs in the targets nor (almost surely) in preds


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


class SegData(Dataset):
    """13 images whose sizes all differ, masks with ignored (255) borders, classes 0..3."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(2)
        self.items = []
        for i in range(NUM_SEG_IMAGES):
            h, w = 9 + i, 17 - i % 5
            x = torch.randn(3, h, w, generator=g)
            y = x[:3].argmax(0) + (x[0] > 1.0).long()  # 0..3
            y[0, :] = 255
            self.items.append((x, y))

    def __len__(self) -> int:
        return NUM_SEG_IMAGES

    def __getitem__(self, i: int):
        x, y = self.items[i]
        return x, y, i


class TinySeg(nn.Module):
    """A conv + BN head answering {"out", "aux"} like DeepLab."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.out = nn.Conv2d(8, NUM_SEG_CLASSES, 1)
        self.aux = nn.Conv2d(8, NUM_SEG_CLASSES, 1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        f = self.body(x)
        return {"out": self.out(f), "aux": self.aux(f)}


def tiny_classifier() -> nn.Module:
    """Same weights in every process; BN running stats made non-trivial by a few training forwards."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(8, NUM_CLASSES))
    with torch.no_grad():
        model(torch.randn(16, 3, 6, 6) + 0.5)
    return model


def tiny_segmenter() -> nn.Module:
    """Same weights in every process, trained-mode BN stats touched once."""
    torch.manual_seed(0)
    model = TinySeg()
    with torch.no_grad():
        model(torch.randn(2, 3, 10, 10))
    return model


def loader(dataset: Dataset, rank: int, world: int, batch_size: int) -> DataLoader:
    """An exact-evaluation loader: the data package's fixed blocks of indices, whole blocks per rank, no padding."""
    return DataLoader(dataset, batch_sampler=EvalBatchSampler(len(dataset), batch_size, rank, world))


def evaluate_both(rank: int, world: int, out_dir: str) -> dict:
    """Classification and segmentation evaluation with exports; runs in each rank (or in the test)."""
    torch.set_num_threads(1 + rank % 2)  # what each process had before: evaluation must not depend on it
    cls_model, seg_model = tiny_classifier(), tiny_segmenter()
    cls_model.train()  # evaluate() must switch to eval and back
    cls = evaluate(cls_model, loader(ClsData(), rank, world, 8), "classification", NUM_CLASSES, "cpu",
                   export=Path(out_dir) / "cls", threads=1)
    seg = evaluate(seg_model.eval(), loader(SegData(), rank, world, 1), "segmentation", NUM_SEG_CLASSES,
                   "cpu", export=Path(out_dir) / "seg", threads=1)
    return {"cls": cls, "seg": seg, "cls_training_after": cls_model.training,
            "seg_training_after": seg_model.training, "threads_after": torch.get_num_threads()}


def same(a: dict[str, float], b: dict[str, float]) -> bool:
    """Every metric equal bit for bit (NaN equal to NaN)."""
    return a.keys() == b.keys() and all((math.isnan(a[k]) and math.isnan(b[k])) or a[k] == b[k] for k in a)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """One process, no process group: the result every world size must reproduce."""
    out = tmp_path_factory.mktemp("reference")
    return evaluate_both(0, 1, str(out)), out


def test_reference_metrics_are_plausible(reference: tuple[dict, Path]) -> None:
    res, _ = reference
    assert set(res["cls"]) == {"loss", "top1", "top5"}
    assert 0 < res["cls"]["top1"] <= res["cls"]["top5"] <= 100
    # k / 101 in percent: the accuracies are counts of whole samples
    assert round(res["cls"]["top1"] * NUM_CLS_SAMPLES / 100, 9).is_integer()
    assert res["cls_training_after"] is True and res["seg_training_after"] is False
    seg = res["seg"]
    assert {"loss", "miou", "pixel_acc"} <= set(seg) and len([k for k in seg if k.startswith("iou_")]) == 5
    assert 0 <= seg["miou"] <= 1 and 0 <= seg["pixel_acc"] <= 1


@pytest.mark.parametrize("world", [1, 2, 3])
def test_distributed_evaluation_equals_one_process(world: int, reference: tuple[dict, Path], tmp_path: Path) -> None:
    ref, ref_dir = reference
    results = run_on_ranks(world, evaluate_both, str(tmp_path))
    for rank, res in enumerate(results):
        assert same(res["cls"], ref["cls"]), (rank, res["cls"], ref["cls"])
        assert same(res["seg"], ref["seg"]), (rank, res["seg"], ref["seg"])
        assert res["cls_training_after"] is True and res["seg_training_after"] is False
        assert res["threads_after"] == 1 + rank % 2, "the process's thread count is restored"

    # Exports: complete, in dataset order, and the same predictions as one process.
    preds = np.load(tmp_path / "cls" / "predictions.npy")
    assert preds.shape == (NUM_CLS_SAMPLES,)
    np.testing.assert_array_equal(preds, np.load(ref_dir / "cls" / "predictions.npy"))
    csv = (tmp_path / "cls" / "predictions.csv").read_text().splitlines()
    assert csv[0] == "index,prediction" and len(csv) == NUM_CLS_SAMPLES + 1
    assert [int(line.split(",")[0]) for line in csv[1:]] == list(range(NUM_CLS_SAMPLES))
    names = sorted(p.name for p in (tmp_path / "seg").iterdir())
    assert names == [mask_filename(i) for i in range(NUM_SEG_IMAGES)]
    data = SegData()
    for i in range(NUM_SEG_IMAGES):
        got = Image.open(tmp_path / "seg" / mask_filename(i))
        assert got.mode == "P" and got.size == (data.items[i][0].shape[2], data.items[i][0].shape[1])
        np.testing.assert_array_equal(np.array(got), np.array(Image.open(ref_dir / "seg" / mask_filename(i))))


def test_reference_export_matches_the_model(tmp_path: Path) -> None:
    """The exported files hold the model's argmax, not just something consistent across runs."""
    model, data = tiny_segmenter().eval(), SegData()
    with torch.inference_mode():
        direct = model(data.items[5][0].unsqueeze(0))["out"].argmax(1)[0].numpy()
    evaluate(model, loader(data, 0, 1, 1), "segmentation", NUM_SEG_CLASSES, "cpu", export=tmp_path)
    np.testing.assert_array_equal(np.array(Image.open(tmp_path / mask_filename(5))), direct)


def test_segmentation_loss_is_pixel_weighted_cross_entropy() -> None:
    model, data = tiny_segmenter().eval(), SegData()
    num, den = 0.0, 0
    with torch.inference_mode():
        for x, y in data.items:
            logits = model(x.unsqueeze(0))["out"]
            loss = nn.functional.cross_entropy(logits, y.unsqueeze(0), ignore_index=255, reduction="sum")
            num, den = num + float(loss), den + int((y != 255).sum())
    res = evaluate(model, loader(data, 0, 1, 1), "segmentation", NUM_SEG_CLASSES, "cpu")
    # float32 per-pixel losses summed in a different order: agree to 1e-6 relative
    assert res["loss"] == pytest.approx(num / den, rel=1e-6)


def test_custom_loss_fn_reduced_or_not_gives_the_same_mean() -> None:
    model, data = tiny_classifier(), ClsData()
    unreduced = evaluate(model, loader(data, 0, 1, 101), "classification", NUM_CLASSES, "cpu",
                         loss_fn=lambda lo, t: nn.functional.cross_entropy(lo, t, reduction="none") * 2)
    reduced = evaluate(model, loader(data, 0, 1, 10), "classification", NUM_CLASSES, "cpu",
                       loss_fn=lambda lo, t: nn.functional.cross_entropy(lo, t) * 2)
    plain = evaluate(model, loader(data, 0, 1, 10), "classification", NUM_CLASSES, "cpu")
    # batch means weighted by batch size: the same mean up to float rounding (1e-6 relative)
    assert reduced["loss"] == pytest.approx(unreduced["loss"], rel=1e-6)
    assert unreduced["loss"] == pytest.approx(2 * plain["loss"], rel=1e-6)


def test_duplicated_or_missing_samples_are_an_error() -> None:
    data = ClsData()
    twice = DataLoader(data, batch_size=8, sampler=[0, 1, 2, 2] + list(range(3, 100)))  # 101 items, one twice
    with pytest.raises(RuntimeError, match="more than one rank"):
        evaluate(tiny_classifier(), twice, "classification", NUM_CLASSES, "cpu")
    short = DataLoader(data, batch_size=8, sampler=list(range(50)))
    with pytest.raises(RuntimeError, match="50 of 101"):
        evaluate(tiny_classifier(), short, "classification", NUM_CLASSES, "cpu")
    no_index = DataLoader(torch.utils.data.TensorDataset(data.x, data.y), batch_size=8)
    with pytest.raises(ValueError, match="images, targets, indices"):
        evaluate(tiny_classifier(), no_index, "classification", NUM_CLASSES, "cpu")


def test_bf16_autocast_runs_and_stays_close() -> None:
    model, data = tiny_classifier(), ClsData()
    fp32 = evaluate(model, loader(data, 0, 1, 32), "classification", NUM_CLASSES, "cpu")
    bf16 = evaluate(model, loader(data, 0, 1, 32), "classification", NUM_CLASSES, "cpu", amp="bf16")
    # bf16 has ~3 significant digits; the mean loss of this tiny model moves by far less than 5%
    assert bf16["loss"] == pytest.approx(fp32["loss"], rel=5e-2)


class _Writer:
    """Records add_image calls like a SummaryWriter would receive them."""

    def __init__(self) -> None:
        self.images: list[tuple[str, torch.Tensor, int]] = []

    def add_image(self, tag: str, image: torch.Tensor, global_step: int, dataformats: str) -> None:
        assert dataformats == "CHW"
        self.images.append((tag, image, global_step))


def test_segmentation_panels_show_image_truth_prediction_rows() -> None:
    from src.tasks.pictures import colorize_mask, color_palette, fixed_sample_indices, log_segmentation_panels

    data, model, writer = SegData(), tiny_segmenter().train(), _Writer()
    chosen = log_segmentation_panels(writer, model, data, 7, "cpu", count=3)
    assert chosen == fixed_sample_indices(NUM_SEG_IMAGES, 3) == [0, 6, 12]
    assert model.training  # mode restored
    tag, panel, step = writer.images[0]
    heights = [data.items[i][0].shape[1] for i in chosen]
    widths = [data.items[i][0].shape[2] for i in chosen]
    assert (tag, step, panel.dtype) == ("val/panels", 7, torch.uint8)
    assert panel.shape == (3, sum(heights), 3 * max(widths))
    # second panel of the first row is the coloured ground truth; its ignored top row is white
    h0, w0 = heights[0], widths[0]
    assert torch.equal(panel[:, :h0, w0:2 * w0], colorize_mask(data.items[0][1]))
    assert (panel[:, 0, w0:2 * w0] == 255).all()
    assert color_palette()[1].tolist() == [128, 0, 0]  # VOC colours


def test_classification_grid_frames_right_and_wrong() -> None:
    from src.tasks.pictures import log_classification_grid

    writer = _Writer()
    images = torch.randn(3, 3, 6, 6)
    log_classification_grid(writer, images, 1, targets=torch.tensor([0, 1, 2]), preds=torch.tensor([0, 2, 2]),
                            mean=[0.5] * 3, std=[0.25] * 3, nrow=3)
    grid = writer.images[0][1]
    assert grid.dtype == torch.uint8 and grid.shape == (3, 2 + 10 + 2, 2 + 3 * (10 + 2))
    assert grid[:, 2, 2].tolist() == [0, 200, 0] and grid[:, 2, 14].tolist() == [220, 0, 0]
