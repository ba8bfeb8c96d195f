"""What the data layer needs to know about a task's samples: their transforms and how they are batched.

Each task builds its TaskData in its own files (its transforms module in src/tasks/<task>/) and holds it as
`Task.data`; the caller hands it to build_datasets and the loaders, so the data layer never looks a task up.
The task itself (metrics, loss, evaluation, predictions) is src/tasks/'s; this is only the part of it that
the data layer runs.
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
    # data.device_transforms: the training transform can stop before normalisation (uint8 batches).
    device_transforms: bool = True
    # Batching of (image, target, index) samples into a Batch (src/data/batch.py), for training, evaluation and
    # predict.py (whose targets are None): None = stacked (collate_stacked; evaluation of images of several sizes
    # then goes one image per batch); a task whose samples do not stack gives its own, e.g. collate_lists.
    collate: Optional[Callable[[list], Any]] = None
    # The target entries the task trains on beyond a dataset's usual ones, e.g. {"masks"}: a dataset whose files
    # serve several tasks (registered with a tuple of tasks) reads them only for a task that asks.
    target_keys: frozenset[str] = frozenset()
