"""The data layer's builders with the data handling of the dataset's own task filled in, as a training run hands
it down from its validated config (config.resolved_task.data): for tests that build a dataset or a loader by itself."""
from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader, Dataset

import src.data as data
from src.config import data_config
from src.tasks import get_task


def handling(data_cfg: Any, task: str | None = None) -> data.TaskData:
    """The TaskData of `task`, by default the (first) task that data_cfg.name is registered for."""
    name = data_cfg.name if hasattr(data_cfg, "name") else data_cfg["name"]
    return get_task(task or data.dataset_task(name)).data


def build_datasets(data_cfg: Any, seed: int, device_transforms: bool = False,
                   task: str | None = None) -> data.DataBundle:
    """src.data.build_datasets with the transforms of `task` (default: the dataset's first); a mapping is read
    with every dataset's and task's options (src.config.data_config) and validated."""
    if isinstance(data_cfg, dict):
        data_cfg = data_config(**data_cfg)
        data_cfg.validate()
    return data.build_datasets(data_cfg, handling(data_cfg, task), seed=seed, device_transforms=device_transforms)


def build_train_loader(dataset: Dataset, data_cfg: Any, rank: int, world_size: int, seed: int,
                       drop_last: bool = True) -> DataLoader:
    """src.data.build_train_loader with the dataset's task's collation."""
    return data.build_train_loader(dataset, data_cfg, rank, world_size, seed, drop_last=drop_last,
                                   collate=handling(data_cfg).collate)


def build_eval_loader(dataset: Dataset, data_cfg: Any, rank: int, world_size: int,
                      task: str | None = None) -> DataLoader:
    """src.data.build_eval_loader with the collation of `task` (default: the dataset's first)."""
    return data.build_eval_loader(dataset, data_cfg, rank, world_size, collate=handling(data_cfg, task).collate)
