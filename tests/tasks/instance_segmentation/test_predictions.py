"""predict.py's instance files and the TensorBoard pictures: one JSON row per instance whose RLE decodes to the
model's binarised mask, the score threshold, the drawn overlays, and the masks' COCO form."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from src.data.batch import Batch
from src.tasks import get_task
from src.tasks.instance_segmentation.masks import MASK_THRESHOLD, decode, encode, instance_truth
from src.tasks.instance_segmentation.options import InstanceSegmentationPredict

CLASSES = ["background", "circle", "square"]


def _output(height: int, width: int) -> dict[str, torch.Tensor]:
    """Two instances: a left block scoring 0.9 (class 2) and a right block scoring 0.2 (class 1)."""
    masks = torch.zeros(2, 1, height, width)
    masks[0, 0, 2:10, 1:6] = 0.9
    masks[0, 0, 10, 1:6] = MASK_THRESHOLD  # not above the threshold: outside the instance
    masks[1, 0, 3:8, width - 6:width - 1] = 0.7
    return {"boxes": torch.tensor([[1.0, 2.0, 6.0, 10.0], [width - 6.0, 3.0, width - 1.0, 8.0]]),
            "scores": torch.tensor([0.9, 0.2]), "labels": torch.tensor([2, 1]), "masks": masks}


def _predict(tmp_path: Path, draw: bool, threshold: float) -> list[dict]:
    sizes = [(20, 16), (14, 24)]
    images = [torch.rand(3, h, w) for h, w in sizes]
    batches = [Batch(images, None, torch.tensor([0, 1]))]
    path = get_task("instance_segmentation").predict(
        batches, lambda batch: [_output(*im.shape[-2:]) for im in batch.images], files=[Path("a.png"), Path("d/b.jpg")],
        out_dir=tmp_path, class_names=CLASSES, batch_count=1,
        options=InstanceSegmentationPredict(score_threshold=threshold, draw=draw))
    return json.loads(path.read_text())


@pytest.mark.usefixtures("one_thread")  # the drawing: many small tensor operations, slowed by threads when busy
def test_rows_hold_each_instance_as_coco_rle(tmp_path: Path) -> None:
    rows = _predict(tmp_path, draw=True, threshold=0.0)
    assert [(r["file"], r["class"], r["score"]) for r in rows] == [
        ("a.png", "square", 0.9), ("a.png", "circle", 0.2), ("d/b.jpg", "square", 0.9), ("d/b.jpg", "circle", 0.2)]
    for row, (h, w) in zip(rows, [(20, 16), (20, 16), (14, 24), (14, 24)]):
        expected = _output(h, w)["masks"][0 if row["class"] == "square" else 1, 0] > MASK_THRESHOLD
        assert row["segmentation"]["size"] == [h, w]
        assert torch.equal(decode([row["segmentation"]], h, w)[0], expected)
    # Enlarged by whole factors to a long side of at least 512 px (26 and 22), a legend on the right.
    for name, (height, width), factor in (("a.png", (20, 16), 26), ("d/b.png", (14, 24), 22)):
        drawn = Image.open(tmp_path / "masks" / name)
        assert drawn.height == height * factor and drawn.width > width * factor, name


def test_score_threshold_and_no_drawing(tmp_path: Path) -> None:
    rows = _predict(tmp_path, draw=False, threshold=0.5)
    assert [r["score"] for r in rows] == [0.9, 0.9] and not (tmp_path / "masks").exists()


def test_rle_round_trip_and_the_ground_truth_of_masks() -> None:
    masks = torch.zeros(3, 9, 7, dtype=torch.bool)
    masks[0, 1:4, 2:6] = True
    masks[2, 5:, :] = True
    assert torch.equal(decode(encode(masks), 9, 7), masks) and encode(masks[:0]) == []
    target = {"boxes": torch.tensor([[2.0, 1.0, 6.0, 4.0], [0.0, 5.0, 7.0, 9.0]]), "labels": torch.tensor([1, 2]),
              "masks": masks[[0, 2]].to(torch.uint8)}
    truth = instance_truth(4, target, 3)
    assert truth.image == {"id": 4, "height": 9, "width": 7}
    assert [a["area"] for a in truth.annotations] == [12.0, 28.0]  # the masks' pixels, COCO's segment area
    assert [a["bbox"] for a in truth.annotations] == [[2.0, 1.0, 4.0, 3.0], [0.0, 5.0, 7.0, 4.0]]


@pytest.mark.usefixtures("one_thread")
def test_pictures(writer) -> None:
    from src.data.datasets.shapes.instance_segmentation import ShapesInstances
    from src.models import build_model

    task = get_task("instance_segmentation")
    data = ShapesInstances(0, "val", 4, image_size=40, num_shape_kinds=2)
    samples = [(data[i][0].float() / 255, data[i][1]) for i in range(4)]
    task.log_train_samples(writer, [s[0] for s in samples], [s[1] for s in samples], 1, mean=(0,) * 3, std=(1,) * 3)
    model = build_model({"name": "maskrcnn_resnet18", "head_channels": 32}, {"name": "bn"}, 3)
    task.log_eval_pictures(writer, model, samples, 2, torch.device("cpu"), mean=(0,) * 3, std=(1,) * 3, amp="none")
    assert [t for t, _, _ in writer.images] == ["train/samples"] + [f"val/instances_{n}" for n in range(4)]
    assert all(image.dtype == torch.uint8 and image.shape[0] == 3 for _, image, _ in writer.images)
