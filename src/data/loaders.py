"""The training and evaluation loaders: this rank's batches of a dataset, as Batches (src/data/batch.py), in
loaders whose worker processes end when closed (src/data/closable_loader.py)."""
from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from src.data.batch import Batch, collate_stacked
from src.data.closable_loader import ClosableLoader
from src.data.config import DataConfig, checked
from src.data.samplers import EvalBatchSampler, TrainBatchSampler
from src.data.seeded import IndexedDataset
from src.data.worker_cap import loader_workers


def _loader_kwargs(cfg: DataConfig) -> dict[str, Any]:
    workers = loader_workers(cfg.num_workers)  # at most this process's share of the cores
    kwargs: dict[str, Any] = {
        "num_workers": workers,
        # Pinned memory only helps host-to-GPU copies; on CPU-only machines it just costs.
        "pin_memory": cfg.pin_memory and torch.cuda.is_available(),
    }
    if workers > 0:
        kwargs["persistent_workers"] = cfg.persistent_workers
        kwargs["prefetch_factor"] = cfg.prefetch_factor
    return kwargs


def build_train_loader(dataset: Dataset, data_cfg: Any, rank: int, world_size: int, seed: int,
                       drop_last: bool = True, collate: Any = None) -> ClosableLoader:
    """Loader over this rank's micro-batches (TrainBatchSampler); yields Batches. `collate`: the task's
    (TaskData.collate; None = collate_stacked).

    No worker_init_fn: augmentation is seeded per sample from (seed, epoch, index), so worker RNG
    states never matter, and the epoch reaches workers inside the sampled indices.
    """
    cfg = checked(data_cfg)
    sampler = TrainBatchSampler(len(dataset), cfg.batch_size, rank=rank, world_size=world_size, seed=seed,
                                shuffle=True, drop_last=drop_last)
    # EncodedFiles (data.decode_on_device) collates its byte strings itself; others as their task says
    # (stacked unless the task's samples do not stack, e.g. detection's lists of boxes).
    own = getattr(dataset, "collate_fn", None)
    batches = partial(_collate_with, own) if own is not None else collate or collate_stacked
    # Its own generator: every new iterator draws its workers' base seed from the loader's generator, which would
    # otherwise be the global one, so a run resumed mid-epoch (one more iterator than the uninterrupted run made at
    # that point) would shift the RNG that MixUp and dropout draw from after a checkpoint restored it.
    return ClosableLoader(IndexedDataset(dataset), batch_sampler=sampler, collate_fn=batches,
                          generator=torch.Generator().manual_seed(seed), **_loader_kwargs(cfg))


def _collate_with(collate_pairs: Any, samples: list) -> Batch:
    """A Batch from a dataset's own collate_fn of (image, target) pairs, with the samples' indices."""
    images, targets = collate_pairs([(s[0], s[1]) for s in samples])
    return Batch(images, targets, torch.tensor([int(s[2]) for s in samples], dtype=torch.int64))


def build_eval_loader(dataset: Dataset, data_cfg: Any, rank: int, world_size: int,
                      collate: Any = None) -> ClosableLoader:
    """Loader over this rank's batches (EvalBatchSampler); yields Batches.
    `collate`: the task's (TaskData.collate; None = collate_stacked).

    The batches are fixed blocks of data.eval_batch_size dataset indices, so every image meets the same
    neighbours (and padding) at any world size. Datasets whose images can differ in size (segmentation at each
    image's own size) use batch size 1, unless the task's own collation takes any sizes.
    """
    cfg = checked(data_cfg)
    batch_size = cfg.eval_batch_size if getattr(dataset, "same_size", True) or collate is not None else 1
    return ClosableLoader(IndexedDataset(dataset), collate_fn=collate or collate_stacked,
                          batch_sampler=EvalBatchSampler(len(dataset), batch_size, rank, world_size),
                          **_loader_kwargs(cfg))


def set_loader_epoch(loader: DataLoader, epoch: int) -> None:
    """Set the epoch of a train loader's sampler and dataset (order and augmentation of that epoch)."""
    sampler = loader.batch_sampler
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)
    if hasattr(loader.dataset, "set_epoch"):
        loader.dataset.set_epoch(epoch)
