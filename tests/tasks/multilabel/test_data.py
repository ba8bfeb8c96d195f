"""The multi-label datasets: data=shapes_multilabel (the embedded scenes, labelled with the kinds they show) and
data=multilabel_folder (a labels.csv per split, its errors), and classification's transforms leaving their multi-hot
targets untouched."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

from src.config import data_config
from src.data.datasets.shapes import drawing
from src.data.datasets.shapes.datasets import ShapesDetection
from src.data.datasets.shapes.multilabel import ShapesMultiLabel
from tests.support.task_data import build_datasets

ARGS = dict(image_size=40, num_shape_kinds=5, min_shapes=1, max_shapes=4, radius_range=(0.15, 0.3))


def test_the_labels_are_the_kinds_the_scenes_show() -> None:
    labels, boxes = ShapesMultiLabel(2, "val", 40, **ARGS), ShapesDetection(2, "val", 40, **ARGS)
    assert labels.classes == list(drawing.SHAPE_NAMES[:5])
    hidden = 0
    for i in range(len(labels)):
        image, target = labels[i]
        det_image, det_target = boxes[i]
        assert torch.equal(image, det_image) and target.dtype == torch.float32 and target.shape == (5,)
        expected = torch.zeros(5)
        expected[det_target["labels"] - 1] = 1  # a box per visible shape, labelled kind + 1
        assert torch.equal(target, expected), i
        _, _, kinds = drawing.make_instance_image(2, "val", i, 40, 5, 1, 4, radius_range=(0.15, 0.3))
        hidden += len(set(kinds)) - int(target.sum())
    assert hidden > 0  # some kind drawn but (nearly) hidden is not a label: the rule was exercised


def test_classification_transforms_leave_the_multi_hot_target_alone() -> None:
    cfg = {"name": "shapes_multilabel", "train_size": 16, "val_size": 4, "image_size": 32, "num_classes": 6,
           "auto_augment": "randaugment", "random_erase": 0.5, "color_jitter": 0.4}
    for device_transforms in (False, True):
        bundle = build_datasets(cfg, seed=0, device_transforms=device_transforms)
        assert bundle.task == "multilabel" and bundle.class_names == list(drawing.SHAPE_NAMES[:6])
        for epoch in range(2):
            for i in range(16):
                image, target = bundle.train[(epoch, i)]
                target = getattr(target, "target", target)  # data.device_transforms' erasing wraps it
                assert image.shape == (3, 32, 32) and torch.equal(target, bundle.train.base[i][1])
    image, target = bundle.val[3]
    assert image.dtype == torch.float32 and torch.equal(target, bundle.val.base[3][1])


def _write(root: Path, split: str, rows: list[str], images: list[str]) -> None:
    folder = root / split
    for name in images:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (20 + len(name), 16), (len(name) * 20, 90, 30)).save(folder / name)
    (folder / "labels.csv").write_text("\n".join(rows) + "\n")


def test_a_folder_with_labels_csv(tmp_path: Path) -> None:
    _write(tmp_path, "train", ["file,labels,notes", "a/1.jpg,dog cat,x", "2.png,cat", "3.jpg,", '"4 four.jpg","bird|cat"'],
           ["a/1.jpg", "2.png", "3.jpg", "4 four.jpg"])
    _write(tmp_path, "val", ["labels,file", "dog,v.jpg"], ["v.jpg"])
    bundle = build_datasets({"name": "multilabel_folder", "root": str(tmp_path), "image_size": 16,
                             "resize_size": 16, "mean": [0.5] * 3, "std": [0.25] * 3}, seed=0)
    assert bundle.class_names == ["bird", "cat", "dog"] and bundle.num_classes == 3
    assert [bundle.train.base[i][1].tolist() for i in range(4)] == [[0, 1, 1], [0, 1, 0], [0, 0, 0], [1, 1, 0]]
    image, target = bundle.val[0]
    assert image.shape == (3, 16, 16) and target.tolist() == [0, 0, 1]


@pytest.mark.parametrize("train_rows, val_rows, error, message", [
    (["file;labels"], ["file,labels"], ValueError, r"header must name the columns file,labels"),
    (["file,labels", "1.jpg,cat", "1.jpg,dog"], ["file,labels", "v.jpg,cat"], ValueError,
     r"labels.csv:3: 1.jpg is listed again \(first on line 2\)"),
    (["file,labels", "gone.jpg,cat"], ["file,labels", "v.jpg,cat"], FileNotFoundError,
     r"labels.csv:2: no image at .*gone.jpg"),
    (["file,labels", "1.jpg,cat"], ["file,labels", "v.jpg,cat owl"], ValueError,
     r"val/labels.csv has labels that no training image has: \['owl'\]"),
    (["file,labels"], ["file,labels", "v.jpg,cat"], ValueError, "no rows"),
])
def test_folder_mistakes_name_the_file_and_line(tmp_path: Path, train_rows: list[str], val_rows: list[str],
                                                error: type, message: str) -> None:
    _write(tmp_path, "train", train_rows, ["1.jpg"])
    _write(tmp_path, "val", val_rows, ["v.jpg"])
    with pytest.raises(error, match=message):
        build_datasets(data_config(name="multilabel_folder", root=str(tmp_path)), seed=0)


def test_a_missing_folder_or_csv_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=f"expected the folder {tmp_path / 'nope' / 'train'}"):
        build_datasets(data_config(name="multilabel_folder", root=str(tmp_path / "nope")), seed=0)
    (tmp_path / "train").mkdir()
    with pytest.raises(FileNotFoundError, match=f"no labels.csv in {tmp_path / 'train'}"):
        build_datasets(data_config(name="multilabel_folder", root=str(tmp_path)), seed=0)
