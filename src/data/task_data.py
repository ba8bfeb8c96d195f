"""What the data layer needs to know about a task's samples: their transforms and how they are batched.

Each transform module registers its task's entry once (src/data/transforms.py: classification,
src/data/seg_transforms.py: segmentation, ...), keyed by the task name that datasets are registered with;
build_datasets, the loaders and DataConfig.validate read it. The task itself (metrics, loss, evaluation,
predictions) is src/tasks/'s; this is only the part of it that lives below the models.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional


@dataclass(frozen=True)
class TaskData:
    """One task's data handling."""

    task: str
    train: Callable[..., Any]  # (DataConfig, on_device: bool) -> the training transform of (image, target) pairs
    eval: Callable[..., Any]  # (DataConfig) -> the evaluation transform of pairs
    predict: Callable[..., Any]  # (DataConfig) -> the transform of a new image for predict.py
    # Training and evaluation samples all have data.image_size (so val batches > 1 collate whatever the files).
    fixed_size: bool = False
    # Datasets of varying sizes are evaluated Resize(data.resize_size) + CenterCrop(data.image_size).
    resize_then_crop: bool = False
    # data.auto_augment and data.random_erase apply (image-only augmentations that leave the target as it is).
    image_only_augmentations: bool = False
    # data.device_transforms: the training transform can stop before normalisation (uint8 batches).
    device_transforms: bool = True
    # Batching: None = torch's default_collate (tensors stacked); else a function of the list of samples:
    # `collate` of (image, target) pairs (and predict.py's (image, index) pairs), `eval_collate` of the
    # evaluation loader's (image, target, index) triples, which must yield (images, targets, int64 indices).
    collate: Optional[Callable[[list], Any]] = None
    eval_collate: Optional[Callable[[list], Any]] = None


_TASKS: dict[str, TaskData] = {}


def register_task_data(entry: TaskData) -> TaskData:
    """Add `entry` (once per task name)."""
    if entry.task in _TASKS:
        raise ValueError(f"the data handling of task {entry.task!r} is registered twice")
    _TASKS[entry.task] = entry
    return entry


def task_data(task: str) -> TaskData:
    """The entry of `task`; ValueError naming the tasks that have one."""
    try:
        return _TASKS[task]
    except KeyError:
        raise ValueError(f"no data handling is registered for task {task!r} (tasks with one: "
                         f"{', '.join(sorted(_TASKS))}); register a TaskData in the task's transform module, "
                         "see docs/training.md, 'Add your own task'") from None


def all_task_data() -> list[TaskData]:
    """Every registered entry, in registration order."""
    return list(_TASKS.values())
