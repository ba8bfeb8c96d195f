"""Datasets on disk, proven with tiny files written here (nothing can be downloaded in tests)."""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import datasets

from src.data import DataConfig
from src.config import data_config
from src.errors import UserError
from tests.support.task_data import build_datasets, build_eval_loader, build_train_loader
from tests.data.fake_cifar10 import write_fake_cifar10


def test_cifar10_loads_torchvision_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lists = write_fake_cifar10(tmp_path)
    # The real files' checksums are torchvision constants; point them at our tiny files instead.
    for attr, value in lists.items():
        monkeypatch.setattr(datasets.CIFAR10, attr, value)
    cfg = data_config(name="cifar10", root=str(tmp_path), batch_size=4, eval_batch_size=3,
                     mean=[0.49, 0.48, 0.45], std=[0.25, 0.24, 0.26])
    bundle = build_datasets(cfg, seed=0)
    assert bundle.num_classes == 10 and bundle.task == "classification"
    assert bundle.class_names == [f"c{i}" for i in range(10)]
    assert len(bundle.train) == 20 and len(bundle.val) == 4
    x, y, _ = next(iter(build_train_loader(bundle.train, cfg, 0, 1, seed=0)))
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
        build_datasets(data_config(name=name, root=str(tmp_path / "nowhere")), seed=0)
    msg = str(info.value)
    assert str((tmp_path / "nowhere" / folder).resolve()) in msg and "data.download=true" in msg


def test_cifar_corrupt_files_say_what_to_do(tmp_path: Path) -> None:
    write_fake_cifar10(tmp_path)  # real torchvision checksums: these files do not match them
    with pytest.raises(UserError, match="checksum"):
        build_datasets(data_config(name="cifar10", root=str(tmp_path)), seed=0)


def _png(path: Path, size: tuple[int, int], colour: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((size[1], size[0], 3), colour, dtype=np.uint8)).save(path)


def test_imagefolder(tmp_path: Path) -> None:
    for split in ("train", "val"):
        for c, cls in enumerate(("ant", "bee", "cat")):
            for i in range(3):
                _png(tmp_path / split / cls / f"{i}.png", (50 + 10 * i, 40), 80 * c)
    cfg = data_config(name="imagefolder", root=str(tmp_path), image_size=24, resize_size=28, batch_size=3,
                     eval_batch_size=4)
    bundle = build_datasets(cfg, seed=0)
    assert bundle.class_names == ["ant", "bee", "cat"] and bundle.num_classes == 3
    x, y, _ = next(iter(build_train_loader(bundle.train, cfg, 0, 1, seed=0)))
    assert x.shape == (3, 3, 24, 24)
    xs, ys, idx = next(iter(build_eval_loader(bundle.val, cfg, 0, 1)))
    assert xs.shape == (4, 3, 24, 24) and ys.tolist() == [0, 0, 0, 1] and idx.tolist() == [0, 1, 2, 3]


def test_imagefolder_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str((tmp_path / "train").resolve())):
        build_datasets(data_config(name="imagefolder", root=str(tmp_path)), seed=0)
    _png(tmp_path / "train" / "a" / "0.png", (8, 8), 0)
    _png(tmp_path / "val" / "b" / "0.png", (8, 8), 0)
    cfg = data_config(name="imagefolder", root=str(tmp_path), image_size=8, resize_size=8)
    with pytest.raises(ValueError, match="at least two"):
        build_datasets(cfg, seed=0)
    _png(tmp_path / "train" / "c" / "0.png", (8, 8), 0)
    with pytest.raises(ValueError, match=r"class folders that .* lacks: \['b'\]"):
        build_datasets(cfg, seed=0)
