"""data=coco: a COCO-format folder loads with contiguous labels, drops crowd and zero-area boxes, and each bad
file or entry is refused at build time with an error naming it."""
from __future__ import annotations

import functools
import json
import operator
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torchvision import tv_tensors

from tests.support.task_data import build_datasets, build_train_loader
from src.data.config import DataConfig
from src.data.registry import Splits, dataset_entry
from src.config import data_config
from tests.support.coco_files import CLASS_NAMES, tiny_coco, write_coco_folder
from tests.support import unreadable


def _build(root: Path) -> Splits:
    cfg = data_config(name="coco", root=str(root), train_split="train", val_split="val")
    cfg.validate()
    return dataset_entry("coco").builder(cfg)


def test_loads_with_contiguous_labels_and_drops_crowd_and_zero_area(tmp_path: Path) -> None:
    splits = _build(write_coco_folder(tmp_path))
    assert splits.class_names == CLASS_NAMES and len(splits.train) == len(splits.val) == 4
    expected = {  # image size (H, W), XYXY boxes, labels (category 3 -> 1, 7 -> 2): see tiny_coco()
        0: ((24, 40), [[2, 3, 12, 8], [20, 10, 30, 22]], [1, 2]),
        1: ((20, 32), [[0, 0, 16, 12]], [2]),  # JPEG; its crowd box dropped
        2: ((28, 36), [[5, 5, 25, 15]], [1]),  # in a sub-folder; its zero-width box dropped
        3: ((16, 16), [], []),  # no annotations
    }
    for i, (size, boxes, labels) in expected.items():
        image, target = splits.val[i]
        assert isinstance(image, tv_tensors.Image) and image.dtype == torch.uint8 and tuple(image.shape) == (3, *size)
        assert set(target) == {"boxes", "labels", "coco"}  # the validation targets carry COCO's ground truth
        assert set(splits.train[i][1]) == {"boxes", "labels"}
        b = target["boxes"]
        assert isinstance(b, tv_tensors.BoundingBoxes) and b.format == tv_tensors.BoundingBoxFormat.XYXY
        assert tuple(b.canvas_size) == size and b.dtype == torch.float32 and tuple(b.shape) == (len(boxes), 4)
        assert b.tolist() == boxes
        assert target["labels"].dtype == torch.int64 and target["labels"].tolist() == labels
    # The painted boxes are where the json says: the cat of image 1 is red inside its box.
    image, target = splits.train[0]
    x1, y1, x2, y2 = (int(v) for v in target["boxes"][0])
    assert image[:, y1:y2, x1:x2].reshape(3, -1).float().mean(1).tolist() == [220.0, 40.0, 40.0]
    assert splits.train.image_ids == [1, 2, 3, 4]


def test_validation_targets_carry_the_ground_truth_as_the_file_has_it(tmp_path: Path) -> None:
    data = tiny_coco()
    write_coco_folder(tmp_path)
    _edit_val(lambda d: (d["images"][3].pop("width"), d["images"][3].pop("height")))(tmp_path)  # sizes are optional
    splits = _build(tmp_path)
    truths = [splits.val[i][1]["coco"] for i in range(len(splits.val))]
    assert [t.image["id"] for t in truths] == [1, 2, 3, 4] and truths[0].category_ids == (3, 7)
    # Everything the training targets drop is here, unchanged: the crowd region, the zero-width box, ids.
    assert [[a["id"] for a in t.annotations] for t in truths] == [[100, 101], [102, 103], [104, 105], []]
    assert truths[1].annotations[1] == data["annotations"][3] and truths[1].annotations[1]["iscrowd"] == 1
    assert truths[2].annotations[1]["bbox"] == [8, 8, 0, 6]
    assert truths[0].image == data["images"][0]
    assert (truths[3].image["width"], truths[3].image["height"]) == (16, 16)  # filled in from the image


def _edit_val(change: Callable[[dict], Any]) -> Callable[[Path], None]:
    """Rewrite the val split's annotation file with `change` applied to its dict."""
    def spoil(root: Path) -> None:
        path = root / "annotations" / "instances_val.json"
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(data))
    return spoil


def _set(*keys: Any, value: Any) -> Callable[[Path], None]:
    return _edit_val(lambda d: operator.setitem(functools.reduce(operator.getitem, keys[:-1], d), keys[-1], value))


# (case, what spoils the good folder, error type, what the message must name)
CASES = [
    ("no_images_folder", lambda r: shutil.rmtree(r / "val"), FileNotFoundError,
     r"coco images of split 'val' not found: expected the folder .*/val \(coco expects"),
    ("no_json", lambda r: (r / "annotations" / "instances_val.json").unlink(), FileNotFoundError,
     r"expected the file .*/annotations/instances_val\.json"),
    ("not_json", lambda r: (r / "annotations" / "instances_val.json").write_text("{'images': []"), ValueError,
     r"instances_val\.json is not a JSON file"),
    ("not_coco", _edit_val(lambda d: d.pop("categories")), ValueError,
     r"instances_val\.json is not a COCO annotation file: 'categories' missing"),
    ("unknown_image_id", _set("annotations", 1, "image_id", value=99), ValueError,
     r"instances_val\.json: 1 problem\(s\) in 'annotations': "
     r"annotations\[1\] \(id 101\) has image_id 99, which is not in 'images'"),
    ("unknown_category_id", _set("annotations", 4, "category_id", value=5), ValueError,
     r"annotations\[4\] \(id 104\) has category_id 5, which is not in 'categories' \(ids 3, 7\)"),
    ("bbox_length", _set("annotations", 0, "bbox", value=[1, 2, 3]), ValueError,
     r"annotations\[0\] \(id 100\) has bbox \[1, 2, 3\]: it must be \[x, y, width, height\], 4 numbers"),
    ("image_file_missing", lambda r: (r / "val" / "b.jpg").unlink(), FileNotFoundError,
     r"instances_val\.json lists 1 image\(s\) that are not in .*/val: 'b\.jpg' \(image id 2\)"),
    ("categories_differ", _set("categories", 0, "name", value="wolf"), ValueError,
     r"instances_val\.json and .*instances_train\.json define different categories"),
]


@pytest.mark.parametrize("spoil,error,message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_named_at_build(tmp_path: Path, spoil: Callable[[Path], None], error: type, message: str) -> None:
    write_coco_folder(tmp_path)
    spoil(tmp_path)
    with pytest.raises(error, match=message):
        _build(tmp_path)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_image_that_cannot_be_decoded_names_its_file_split_and_sample(tmp_path: Path, num_workers: int) -> None:
    write_coco_folder(tmp_path)
    bad = unreadable.truncate(tmp_path / "train" / "b.jpg")  # image id 2: sample 1
    cfg = data_config(name="coco", root=str(tmp_path), train_split="train", val_split="val", image_size=32,
                      batch_size=4, num_workers=num_workers)
    bundle = build_datasets(cfg, seed=0)
    message = unreadable.error_of_loading(build_train_loader(bundle.train, cfg, 0, 1, seed=0))
    assert unreadable.expected(bad, "training split 'train'", 1) in message
