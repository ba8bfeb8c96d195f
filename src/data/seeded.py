"""Per-sample seeding: augmentation randomness from (seed, epoch, index) only.

Each sample's transform runs under torch's global RNG reseeded from a hash of (seed, epoch, index)
and restored afterwards. So the augmentation of a sample does not depend on which rank or which
DataLoader worker loads it, on the world size or on num_workers, and no worker_init_fn is needed
(worker RNG states are never consulted). torchvision.transforms.v2 draws from torch's global RNG only.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils.data import Dataset

from src.data.image_files import read_sample


def mix_seed(*values: int) -> int:
    """A 63-bit seed from integers (splitmix64 chain): nearby inputs give unrelated seeds."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (int(v) & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        h = (h ^ (h >> 31)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 29
    return h & 0x7FFFFFFFFFFFFFFF


class SeededTransformDataset(Dataset):
    """Applies `transform` to `base[index]` under an RNG seeded from (seed, epoch, index).

    Accepts an int index (uses the epoch of the last `set_epoch`) or an (epoch, index) pair, which is
    what TrainBatchSampler yields so that forked DataLoader workers always see the right epoch.
    `same_size` says whether every sample has the same shape (so batches > 1 can be collated). `split` says
    which data this is ("training split 'train'"), for the error of a file that cannot be decoded.
    """

    def __init__(self, base: Dataset, transform: Callable[..., Any], seed: int, same_size: bool = True,
                 split: str = "dataset") -> None:
        self.base = base
        self.split = split
        self.transform = transform
        self.seed = int(seed)
        self.epoch = 0
        self.same_size = same_size

    def set_epoch(self, epoch: int) -> None:
        """Epoch used for plain int indices."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, Any]:
        epoch, index = key if isinstance(key, tuple) else (self.epoch, key)
        image, target = read_sample(self.base, index, self.split)
        with torch.random.fork_rng(devices=[]):
            # Only the CPU generator: torch.manual_seed would also reseed (and not restore) CUDA's.
            torch.default_generator.manual_seed(mix_seed(self.seed, epoch, index))
            return self.transform(image, target)


class IndexedDataset(Dataset):
    """(image, target, index): every Batch carries its samples' dataset indices (src/data/batch.py); evaluation and
    predict.py gather predictions in dataset order by them. A key may be TrainBatchSampler's (epoch, index)."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, Any, int]:
        image, target = self.dataset[key]
        return image, target, key[1] if isinstance(key, tuple) else key

    def set_epoch(self, epoch: int) -> None:
        """The wrapped dataset's epoch for plain int indices (SeededTransformDataset)."""
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)
