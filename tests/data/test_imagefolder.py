"""data=imagefolder on a tree as real users have one: nested folders, upper-case extensions, grayscale /
RGBA / CMYK images of many sizes, macOS and Jupyter leftovers, a class missing from validation."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from src.data import DataConfig
from src.config import data_config
from tests.support.task_data import build_datasets, build_eval_loader, build_train_loader
from tests.support.unreadable import error_of_loading, expected, truncate


def _save(path: Path, w: int, h: int, mode: str = "RGB", value: int = 100) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((h, w, 3), value, dtype=np.uint8)).convert(mode).save(path)


def write_tree(root: Path) -> None:
    """train: ant (nested, .JPEG), bee (grayscale, RGBA), cat (CMYK JPEG); val: ant and cat only (no bee)."""
    _save(root / "train" / "ant" / "a0.JPEG", 40, 30, value=10)
    _save(root / "train" / "ant" / "day2" / "a1.jpg", 64, 48, value=10)  # nested folder inside a class
    _save(root / "train" / "bee" / "b0.png", 30, 50, mode="L", value=120)
    _save(root / "train" / "bee" / "b1.png", 33, 33, mode="RGBA", value=120)
    _save(root / "train" / "cat" / "c0.jpg", 50, 40, mode="CMYK", value=240)
    _save(root / "val" / "ant" / "v0.jpeg", 36, 36, value=10)
    _save(root / "val" / "cat" / "v1.Jpg", 48, 32, value=240)
    # Leftovers of real tools: they must not become classes or samples.
    _save(root / "train" / ".ipynb_checkpoints" / "x.jpg", 8, 8)
    _save(root / "train" / "ant" / ".ipynb_checkpoints" / "a0-checkpoint.jpg", 8, 8)
    (root / "train" / "ant" / "._a0.JPEG").write_bytes(b"\0\5\26\7 AppleDouble, not a JPEG")
    (root / "train" / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (root / "train" / "cat" / "Thumbs.db").write_bytes(b"\xd0\xcf\x11\xe0")


def test_real_tree_labels_and_crops(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_tree(tmp_path)
    cfg = data_config(name="imagefolder", root=str(tmp_path), image_size=24, resize_size=28, batch_size=5,
                     eval_batch_size=8, mean=[0.0, 0.0, 0.0], std=[1.0, 1.0, 1.0])
    with caplog.at_level("WARNING"):
        bundle = build_datasets(cfg, seed=0)
    assert bundle.class_names == ["ant", "bee", "cat"] and bundle.num_classes == 3
    assert len(bundle.train) == 5 and len(bundle.val) == 2
    assert "no validation images: ['bee']" in caplog.text
    x, y, _ = next(iter(build_train_loader(bundle.train, cfg, 0, 1, seed=0)))
    assert x.shape == (5, 3, 24, 24) and sorted(y.tolist()) == [0, 0, 1, 1, 2]
    xs, ys, _ = next(iter(build_eval_loader(bundle.val, cfg, 0, 1)))
    # val has no "bee" folder: "cat" must keep the training index 2 (torchvision alone would make it 1).
    assert xs.shape == (2, 3, 24, 24) and ys.tolist() == [0, 2]
    # Uniform images: pixel values survive Resize + CenterCrop (the CMYK one was converted to RGB).
    assert torch.allclose(xs[0] * 255, torch.full_like(xs[0], 10), atol=1.5)
    assert torch.allclose(xs[1] * 255, torch.full_like(xs[1], 240), atol=1.5)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_unreadable_image_names_its_file_split_and_sample(tmp_path: Path, num_workers: int) -> None:
    write_tree(tmp_path)
    (tmp_path / "val" / "cat" / "v1.Jpg").write_bytes(b"\xff\xd8\xff truncated")
    bad_train = truncate(tmp_path / "train" / "bee" / "b0.png")  # sample 2: ant's two images come first
    cfg = data_config(name="imagefolder", root=str(tmp_path), image_size=24, resize_size=28, batch_size=5,
                      eval_batch_size=1, num_workers=num_workers)
    bundle = build_datasets(cfg, seed=0)
    message = error_of_loading(build_eval_loader(bundle.val, cfg, 0, 1))
    assert expected(tmp_path / "val" / "cat" / "v1.Jpg", "validation split 'val'", 1) in message
    message = error_of_loading(build_train_loader(bundle.train, cfg, 0, 1, seed=0))
    assert expected(bad_train, "training split 'train'", 2) in message


def test_class_only_in_validation_is_an_error(tmp_path: Path) -> None:
    write_tree(tmp_path)
    _save(tmp_path / "val" / "dog" / "d.jpg", 8, 8)
    with pytest.raises(ValueError, match=r"class folders that .*train lacks: \['dog'\]"):
        build_datasets(data_config(name="imagefolder", root=str(tmp_path), image_size=8, resize_size=8), seed=0)
