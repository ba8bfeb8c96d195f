"""Tiny CIFAR-10 files in torchvision's layout (nothing can be downloaded in tests), for the dataset tests."""
from __future__ import annotations

import hashlib
import pickle
from pathlib import Path

import numpy as np
from torchvision import datasets


def _md5(path: Path) -> str:
    """The file's MD5 in hex, as torchvision's check_integrity computes it."""
    return hashlib.md5(path.read_bytes()).hexdigest()


def write_fake_cifar10(root: Path, n_per_batch: int = 4) -> dict[str, list]:
    """torchvision's layout with tiny batches; returns the MD5 lists matching the files."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    lists: dict[str, list] = {"train_list": [], "test_list": []}
    names = [(n, "train_list") for n, _ in datasets.CIFAR10.train_list] + [("test_batch", "test_list")]
    for i, (name, which) in enumerate(names):
        data = rng.integers(0, 256, size=(n_per_batch, 3 * 32 * 32), dtype=np.uint8)
        labels = [(i + j) % 10 for j in range(n_per_batch)]
        with open(folder / name, "wb") as f:
            pickle.dump({"data": data, "labels": labels}, f)
        lists[which].append([name, _md5(folder / name)])
    meta = folder / "batches.meta"
    with open(meta, "wb") as f:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)]}, f)
    lists["meta"] = {"filename": "batches.meta", "key": "label_names", "md5": _md5(meta)}
    return lists
