"""Datasets on disk, proven with tiny files written here (nothing can be downloaded in tests)."""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import datasets

from src.data import DataConfig, build_datasets, build_eval_loader, build_train_loader
from tests.data.fake_cifar10 import write_fake_cifar10
# part: segmentation
from tests.support.unreadable import error_of_loading, expected, truncate
# /part


def test_cifar10_loads_torchvision_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lists = write_fake_cifar10(tmp_path)
    # The real files' checksums are torchvision constants; point them at our tiny files instead.
    for attr, value in lists.items():
        monkeypatch.setattr(datasets.CIFAR10, attr, value)
    cfg = DataConfig(name="cifar10", root=str(tmp_path), batch_size=4, eval_batch_size=3,
                     mean=[0.49, 0.48, 0.45], std=[0.25, 0.24, 0.26])
    bundle = build_datasets(cfg, seed=0)
    assert bundle.num_classes == 10 and bundle.task == "classification"
    assert bundle.class_names == [f"c{i}" for i in range(10)]
    assert len(bundle.train) == 20 and len(bundle.val) == 4
    x, y = next(iter(build_train_loader(bundle.train, cfg, 0, 1, seed=0)))
    assert x.shape == (4, 3, 32, 32) and x.dtype == torch.float32 and y.dtype == torch.int64
    batches = list(build_eval_loader(bundle.val, cfg, 0, 1))
    assert [b[2].tolist() for b in batches] == [[0, 1, 2], [3]]
    # Evaluation does no augmentation: the first val image, un-normalised, is the stored pixels.
    with open(tmp_path / "cifar-10-batches-py" / "test_batch", "rb") as f:
        raw = pickle.load(f)["data"][0].reshape(3, 32, 32)
    x0 = batches[0][0][0] * torch.tensor(cfg.std)[:, None, None] + torch.tensor(cfg.mean)[:, None, None]
    assert torch.allclose(x0 * 255, torch.from_numpy(raw).float(), atol=1e-3)


@pytest.mark.parametrize("name,folder", [("cifar10", "cifar-10-batches-py"), ("cifar100", "cifar-100-python")])
def test_cifar_missing_offline_says_where(tmp_path: Path, name: str, folder: str) -> None:
    with pytest.raises(FileNotFoundError) as info:
        build_datasets(DataConfig(name=name, root=str(tmp_path / "nowhere")), seed=0)
    msg = str(info.value)
    assert str((tmp_path / "nowhere" / folder).resolve()) in msg and "data.download=true" in msg


def test_cifar_corrupt_files_say_what_to_do(tmp_path: Path) -> None:
    write_fake_cifar10(tmp_path)  # real torchvision checksums: these files do not match them
    with pytest.raises(RuntimeError, match="checksum"):
        build_datasets(DataConfig(name="cifar10", root=str(tmp_path)), seed=0)


def _png(path: Path, size: tuple[int, int], colour: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((size[1], size[0], 3), colour, dtype=np.uint8)).save(path)


def test_imagefolder(tmp_path: Path) -> None:
    for split in ("train", "val"):
        for c, cls in enumerate(("ant", "bee", "cat")):
            for i in range(3):
                _png(tmp_path / split / cls / f"{i}.png", (50 + 10 * i, 40), 80 * c)
    cfg = DataConfig(name="imagefolder", root=str(tmp_path), image_size=24, resize_size=28, batch_size=3,
                     eval_batch_size=4)
    bundle = build_datasets(cfg, seed=0)
    assert bundle.class_names == ["ant", "bee", "cat"] and bundle.num_classes == 3
    x, y = next(iter(build_train_loader(bundle.train, cfg, 0, 1, seed=0)))
    assert x.shape == (3, 3, 24, 24)
    xs, ys, idx = next(iter(build_eval_loader(bundle.val, cfg, 0, 1)))
    assert xs.shape == (4, 3, 24, 24) and ys.tolist() == [0, 0, 0, 1] and idx.tolist() == [0, 1, 2, 3]


def test_imagefolder_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str((tmp_path / "train").resolve())):
        build_datasets(DataConfig(name="imagefolder", root=str(tmp_path)), seed=0)
    _png(tmp_path / "train" / "a" / "0.png", (8, 8), 0)
    _png(tmp_path / "val" / "b" / "0.png", (8, 8), 0)
    cfg = DataConfig(name="imagefolder", root=str(tmp_path), image_size=8, resize_size=8)
    with pytest.raises(ValueError, match="at least two"):
        build_datasets(cfg, seed=0)
    _png(tmp_path / "train" / "c" / "0.png", (8, 8), 0)
    with pytest.raises(ValueError, match=r"class folders that .* lacks: \['b'\]"):
        build_datasets(cfg, seed=0)


# part: segmentation
def _palette_png(path: Path, labels: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    img = Image.fromarray(labels.astype(np.uint8), mode="P")
    img.putpalette([v for i in range(256) for v in (i, 255 - i, (7 * i) % 256)])
    img.save(path)


def _write_fake_voc(root: Path) -> None:
    voc = root / "VOCdevkit" / "VOC2012"
    sizes = {"a": (30, 20), "b": (25, 35), "c": (40, 40)}
    for stem, (w, h) in sizes.items():
        _png(voc / "JPEGImages" / f"{stem}.jpg", (w, h), 100)
        labels = np.zeros((h, w), dtype=np.uint8)
        labels[: h // 2] = 15
        labels[h // 2] = 255  # VOC's "void" border
        _palette_png(voc / "SegmentationClass" / f"{stem}.png", labels)
    (voc / "ImageSets" / "Segmentation").mkdir(parents=True)
    (voc / "ImageSets" / "Segmentation" / "train.txt").write_text("a\nb\n")
    (voc / "ImageSets" / "Segmentation" / "val.txt").write_text("b\nc\n")


def test_voc(tmp_path: Path) -> None:
    _write_fake_voc(tmp_path)
    cfg = DataConfig(name="voc", root=str(tmp_path), crop_size=16, base_size=20, batch_size=2,
                     mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    bundle = build_datasets(cfg, seed=0)
    assert bundle.num_classes == 21 and bundle.class_names[15] == "person" and bundle.task == "segmentation"
    x, m = next(iter(build_train_loader(bundle.train, cfg, 0, 1, seed=0)))
    assert x.shape == (2, 3, 16, 16) and m.shape == (2, 16, 16) and m.dtype == torch.int64
    assert set(m.unique().tolist()) <= {0, 15, 255}
    shapes = []
    for x, m, idx in build_eval_loader(bundle.val, cfg, 0, 1):
        assert x.shape[0] == 1, "VOC images differ in size: one per batch"
        shapes.append(tuple(m.shape[1:]))
        h = m.shape[1]
        assert (m[0, : h // 2] == 15).all() and (m[0, h // 2] == 255).all() and (m[0, h // 2 + 1:] == 0).all()
    assert shapes == [(35, 25), (40, 40)]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_voc_image_or_mask_that_cannot_be_decoded_is_named(tmp_path: Path, num_workers: int) -> None:
    _write_fake_voc(tmp_path)
    voc = tmp_path / "VOCdevkit" / "VOC2012"
    bad_image = truncate(voc / "JPEGImages" / "c.jpg")  # val: b, c
    cfg = DataConfig(name="voc", root=str(tmp_path), crop_size=16, base_size=20, batch_size=2,
                     num_workers=num_workers)
    bundle = build_datasets(cfg, seed=0)
    message = error_of_loading(build_eval_loader(bundle.val, cfg, 0, 1))
    assert expected(bad_image, "validation split 'val'", 1) in message
    bad_mask = voc / "SegmentationClass" / "a.png"  # train: a, b
    bad_mask.write_bytes(b"\x89PNG\r\n\x1a\n cut short")
    message = error_of_loading(build_train_loader(bundle.train, cfg, 0, 1, seed=0))
    assert expected(bad_mask, "training split 'train'", 0, kind="mask") in message


def test_voc_missing_offline_says_where(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as info:
        build_datasets(DataConfig(name="voc", root=str(tmp_path)), seed=0)
    assert str((tmp_path / "VOCdevkit" / "VOC2012").resolve()) in str(info.value)
    assert "data.download=true" in str(info.value)


def _write_fake_cityscapes(root: Path) -> None:
    """One 32x16 image per split with labelIds 0 (unlabeled), 7 (road), 26 (car) and 33 (bicycle) in bands."""
    for split, city in (("train", "aachen"), ("val", "lindau")):
        stem = f"{city}_000000_000019"
        _png(root / "leftImg8bit" / split / city / f"{stem}_leftImg8bit.png", (32, 16), 50)
        ids = np.zeros((16, 32), dtype=np.uint8)  # 0 = unlabeled -> ignore
        ids[:, 8:16] = 7  # road -> 0
        ids[:, 16:24] = 26  # car -> 13
        ids[:, 24:] = 33  # bicycle -> 18
        gt = root / "gtFine" / split / city / f"{stem}_gtFine_labelIds.png"
        gt.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(ids).save(gt)


def test_cityscapes_maps_label_ids_to_train_ids(tmp_path: Path) -> None:
    _write_fake_cityscapes(tmp_path)
    cfg = DataConfig(name="cityscapes", root=str(tmp_path), crop_size=16, base_size=16, batch_size=1)
    bundle = build_datasets(cfg, seed=0)
    assert bundle.num_classes == 19 and bundle.class_names[0] == "road" and bundle.class_names[18] == "bicycle"
    x, m, idx = next(iter(build_eval_loader(bundle.val, cfg, 0, 1)))
    assert x.shape == (1, 3, 16, 32)
    row = m[0, 0]
    assert row[:8].eq(255).all() and row[8:16].eq(0).all() and row[16:24].eq(13).all() and row[24:].eq(18).all()


def test_cityscapes_image_that_cannot_be_decoded_is_named(tmp_path: Path) -> None:
    _write_fake_cityscapes(tmp_path)
    bad = tmp_path / "leftImg8bit" / "val" / "lindau" / "lindau_000000_000019_leftImg8bit.png"
    bad.write_bytes(b"not a PNG at all")
    cfg = DataConfig(name="cityscapes", root=str(tmp_path), crop_size=16, base_size=16, batch_size=1)
    message = error_of_loading(build_eval_loader(build_datasets(cfg, seed=0).val, cfg, 0, 1))
    assert expected(bad, "validation split 'val'", 0) in message


def test_cityscapes_missing_says_where(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as info:
        build_datasets(DataConfig(name="cityscapes", root=str(tmp_path)), seed=0)
    msg = str(info.value)
    assert str((tmp_path / "leftImg8bit" / "train").resolve()) in msg and "gtFine" in msg
# /part
