"""Segmentation's evaluator on real gloo groups: metrics and the mask export for world sizes 1, 2, 3 equal a
one-process evaluation, bit for bit (tests/evaluation/test_loop.py); the export holds the model's
argmax; the loss is pixel-weighted; TensorBoard's panels.

The validation set has 13 images of different sizes (no world size divides it): the shards are uneven and
ranks run different numbers of batches. The int64 confusion matrix and what it gives (mIoU, pixel accuracy,
per-class IoU) and the exported masks are compared exactly (==, NaN == NaN).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn
from torch.utils.data import Dataset

from src.evaluation.loop import evaluate
from src.tasks import get_task
from src.tasks.segmentation.exports import mask_filename
from tests.evaluation.test_loop import loader, same
from tests.support import process_state
from tests.support.gloo import run_on_ranks

pytestmark = pytest.mark.usefixtures("restores_rng")  # tests here seed torch's global generator

NUM_SEG_IMAGES, NUM_SEG_CLASSES = 13, 5  # class 4 never occurs in the targets nor (almost surely) in preds


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


def tiny_segmenter() -> nn.Module:
    """Same weights in every process, trained-mode BN stats touched once."""
    torch.manual_seed(0)
    model = TinySeg()
    with torch.no_grad():
        model(torch.randn(2, 3, 10, 10))
    return model


def evaluate_segmentation(rank: int, world: int, out_dir: str) -> dict:
    """Segmentation evaluation with its export; runs in each rank (or in the test)."""
    torch.set_num_threads(1 + rank % 2)  # what each process had before: evaluation must not depend on it
    model = tiny_segmenter()
    metrics = evaluate(model.eval(), loader(SegData(), rank, world, 1), get_task("segmentation"), NUM_SEG_CLASSES, "cpu",
                       export=Path(out_dir) / "seg", threads=1)
    return {"seg": metrics, "training_after": model.training, "threads_after": torch.get_num_threads()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """One process, no process group: the result every world size must reproduce."""
    out = tmp_path_factory.mktemp("reference")
    with process_state.restoring("torch intra-op threads", "torch's global RNG"):
        return evaluate_segmentation(0, 1, str(out)), out


def test_reference_metrics_are_plausible(reference: tuple[dict, Path]) -> None:
    res, _ = reference
    assert res["training_after"] is False
    seg = res["seg"]
    assert {"loss", "miou", "pixel_acc"} <= set(seg) and len([k for k in seg if k.startswith("iou_")]) == 5
    assert 0 <= seg["miou"] <= 1 and 0 <= seg["pixel_acc"] <= 1


@pytest.mark.parametrize("world", [1, 2, 3])
def test_distributed_evaluation_equals_one_process(world: int, reference: tuple[dict, Path], tmp_path: Path) -> None:
    ref, ref_dir = reference
    results = run_on_ranks(world, evaluate_segmentation, str(tmp_path))
    for rank, res in enumerate(results):
        assert same(res["seg"], ref["seg"]), (rank, res["seg"], ref["seg"])
        assert res["training_after"] is False
        assert res["threads_after"] == 1 + rank % 2, "the process's thread count is restored"

    # The export: complete, in dataset order, each mask at its image's size, the same masks as one process.
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
    evaluate(model, loader(data, 0, 1, 1), get_task("segmentation"), NUM_SEG_CLASSES, "cpu", export=tmp_path)
    np.testing.assert_array_equal(np.array(Image.open(tmp_path / mask_filename(5))), direct)


def test_segmentation_loss_is_pixel_weighted_cross_entropy() -> None:
    model, data = tiny_segmenter().eval(), SegData()
    num, den = 0.0, 0
    with torch.inference_mode():
        for x, y in data.items:
            logits = model(x.unsqueeze(0))["out"]
            loss = nn.functional.cross_entropy(logits, y.unsqueeze(0), ignore_index=255, reduction="sum")
            num, den = num + float(loss), den + int((y != 255).sum())
    res = evaluate(model, loader(data, 0, 1, 1), get_task("segmentation"), NUM_SEG_CLASSES, "cpu")
    # float32 per-pixel losses summed in a different order: agree to 1e-6 relative
    assert res["loss"] == pytest.approx(num / den, rel=1e-6)


@pytest.mark.usefixtures("one_thread")  # many small tensor operations, which threads only slow down when busy
def test_segmentation_panels_show_image_truth_prediction_rows(writer) -> None:
    from src.tasks.pictures import TENSORBOARD_LONG_SIDE, class_colour, enlarge, enlargement, to_uint8_image
    from src.tasks.segmentation.pictures import fixed_sample_indices, log_segmentation_panels

    data, model = SegData(), tiny_segmenter().train()
    chosen = log_segmentation_panels(writer, model, data, 7, "cpu", count=3)
    assert chosen == fixed_sample_indices(NUM_SEG_IMAGES, 3) == [0, 6, 12]
    assert model.training  # mode restored
    tag, panel, step = writer.images[0]
    # Each row enlarged by a whole factor to a long side of at least 256 px, a legend on the right.
    factors = [enlargement(*data.items[i][0].shape[1:], TENSORBOARD_LONG_SIDE) for i in chosen]
    heights = [data.items[i][0].shape[1] * f for i, f in zip(chosen, factors)]
    widths = [data.items[i][0].shape[2] * f for i, f in zip(chosen, factors)]
    assert (tag, step, panel.dtype) == ("val/panels", 7, torch.uint8)
    assert panel.shape[1] == sum(heights) and panel.shape[2] > 3 * max(widths)
    # The first row: the image, then the ground truth over it, each class half-blended in its colour and outlined in
    # it; the ignored top rows tinted white.
    h0, w0, (x, y, _) = heights[0], widths[0], data[0]
    image, truth, mask = enlarge(to_uint8_image(x), factors[0]), panel[:, :h0, w0:2 * w0].int(), enlarge(y, factors[0])
    assert torch.equal(panel[:, :h0, :w0], image)
    labels = torch.unique(y).tolist()
    assert 255 in labels and len(labels) >= 3
    for label in labels:
        colour = torch.tensor((255, 255, 255) if label == 255 else class_colour(label)).view(3, 1)
        shown, beneath = truth[:, mask == label], image.int()[:, mask == label]
        blended, outline = ((shown - (beneath + colour) / 2).abs() <= 1).all(0), (shown == colour).all(0)
        assert (blended | outline).all() and blended.float().mean() > 0.5 and outline.any(), label
