"""Data: datasets (embedded shapes, CIFAR, ImageFolder, VOC, Cityscapes, your own folders), transforms, samplers,
loaders. Every dataset is registered once in DATASETS (src/data/registry.py) by its module in src/data/datasets/.

    bundle = build_datasets(cfg.data, task.data, seed=cfg.seed)      # task.data: the run's task's TaskData
    train_loader = build_train_loader(bundle.train, cfg.data, rank, world_size, seed=cfg.seed, collate=task.data.collate)
    for epoch in range(epochs):
        set_loader_epoch(train_loader, epoch)     # sampler order and augmentation of this epoch
        for batch in train_loader: ...            # Batch(images, targets, indices): src/data/batch.py
    val_loader = build_eval_loader(bundle.val, cfg.data, rank, world_size, collate=task.data.collate)
    for batch in val_loader: ...
    close_loaders(train_loader, val_loader)        # in a finally: their worker processes end, also on an error
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

import src.data.datasets  # noqa: F401  (imports every dataset module, which registers its names)
from src.data.batch import Batch, collate_lists, collate_stacked
from src.data.closable_loader import ClosableLoader, close_loaders
from src.data.config import DataConfig, checked
from src.data.device_decode import DeviceDecoder, EncodedFiles
from src.data.device_transforms import DeviceTransform
from src.data.registry import DATASETS, Splits, dataset_entry, dataset_task, dataset_tasks
from src.data.samplers import EvalBatchSampler, ExactEvalSampler, TrainBatchSampler
from src.data.seeded import IndexedDataset, SeededTransformDataset
from src.data.task_data import TaskData
from src.data.worker_cap import loader_workers

__all__ = [
    "Batch", "ClosableLoader", "DATASETS", "DataBundle", "DataConfig", "EvalBatchSampler", "ExactEvalSampler",
    "Splits", "TrainBatchSampler", "build_datasets", "build_eval_loader", "build_train_loader", "close_loaders",
    "collate_lists", "collate_stacked", "dataset_task", "dataset_tasks", "set_loader_epoch", "TaskData",
]


@dataclass
class DataBundle:
    """What the trainer needs to know about a dataset."""

    train: SeededTransformDataset
    val: SeededTransformDataset
    num_classes: int
    task: str  # the task the datasets were built for (one of their registered tasks, src/tasks/)
    class_names: list[str] = field(default_factory=list)
    # data.device_transforms on: the training batches are uint8 and this finishes them on the device
    # (src/data/device_transforms.py); None: the workers normalise, as the evaluation loaders always do.
    device_transform: DeviceTransform | None = None


def build_datasets(data_cfg: Any, handling: TaskData, seed: int, device_transforms: bool = False) -> DataBundle:
    """Train and val datasets of data_cfg.name with the transforms of `handling` (the run's task's TaskData,
    `Task.data`); downloads are barrier-guarded.

    `seed` (the run's seed) drives training augmentation only; the shapes images are fixed by
    data.generator_seed. Missing files raise FileNotFoundError saying where they must go.
    `device_transforms` (data.device_transforms resolved for the device, see device_transforms_enabled):
    the training transform stops before normalisation and bundle.device_transform finishes the batches.
    With data.decode_on_device the training split yields file bytes, and bundle.device_transform decodes
    and augments them too (src/data/device_decode.py).
    """
    cfg = checked(data_cfg)
    if cfg.decode_on_device and not device_transforms:
        raise ValueError("data.decode_on_device=true needs data.device_transforms on, and it is off here "
                         "(data.device_transforms=auto is on only when training on CUDA): set "
                         "data.device_transforms=true or data.decode_on_device=false")
    entry = dataset_entry(cfg.name)
    if handling.task not in entry.tasks:
        raise ValueError(f"data.name={cfg.name} is a {' and '.join(entry.tasks)} dataset, not {handling.task}'s")
    # A dataset of several tasks reads what this one trains on (src/data/registry.py).
    splits: Splits = entry.builder(cfg, handling) if len(entry.tasks) > 1 else entry.builder(cfg)
    train_tf, eval_tf = handling.train(cfg, device_transforms), handling.eval(cfg)
    same_size = handling.fixed_size or splits.val_same_size
    names = list(splits.class_names)
    decoder = DeviceDecoder(train_tf) if cfg.decode_on_device else None
    if cfg.num_classes is not None and cfg.num_classes != len(names):
        raise ValueError(f"data.num_classes={cfg.num_classes} but {cfg.name} has {len(names)} classes; "
                         "remove the override (it is derived)")
    return DataBundle(
        # The training crops all have one size when augmenting; without augmentation they have the images' sizes.
        train=(EncodedFiles(splits.train, train_tf, seed) if decoder is not None else
               SeededTransformDataset(splits.train, train_tf, seed, same_size=same_size or cfg.augment,
                                      split=f"training split {cfg.train_split!r}")),
        val=SeededTransformDataset(splits.val, eval_tf, seed, same_size=same_size,
                                   split=f"validation split {cfg.val_split!r}"),
        num_classes=len(names),
        task=handling.task,
        class_names=names,
        device_transform=DeviceTransform.from_config(cfg, decoder) if device_transforms else None,
    )


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
