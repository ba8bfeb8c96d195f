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

The API below is defined in its modules (build_datasets and DataBundle: bundle.py; the loaders: loaders.py) and
re-exported here; importing this package registers every dataset (src/data/datasets/).
"""
from __future__ import annotations

import src.data.datasets  # noqa: F401  (imports every dataset module, which registers its names)
from src.data.batch import Batch, collate_lists, collate_stacked
from src.data.bundle import DataBundle, build_datasets
from src.data.closable_loader import ClosableLoader, close_loaders
from src.data.config import DataConfig, checked
from src.data.device_decode import DeviceDecoder, EncodedFiles
from src.data.device_transforms import DeviceTransform
from src.data.loaders import build_eval_loader, build_train_loader, set_loader_epoch
from src.data.registry import DATASETS, Splits, dataset_entry, dataset_task, dataset_tasks
from src.data.samplers import EvalBatchSampler, ExactEvalSampler, TrainBatchSampler
from src.data.seeded import IndexedDataset, SeededTransformDataset
from src.data.task_data import TaskData
from src.data.worker_cap import loader_workers

__all__ = [
    "Batch", "ClosableLoader", "DATASETS", "DataBundle", "DataConfig", "DeviceDecoder", "DeviceTransform",
    "EncodedFiles", "EvalBatchSampler", "ExactEvalSampler", "IndexedDataset", "SeededTransformDataset", "Splits",
    "TaskData", "TrainBatchSampler", "build_datasets", "build_eval_loader", "build_train_loader", "checked",
    "close_loaders", "collate_lists", "collate_stacked", "dataset_entry", "dataset_task", "dataset_tasks",
    "loader_workers", "set_loader_epoch",
]
