"""build_datasets: a dataset's train and val splits with the run's task's transforms, as one DataBundle."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from src.data.config import checked
from src.data.device_decode import DeviceDecoder, EncodedFiles
from src.data.device_transforms import DeviceTransform
from src.data.registry import Splits, dataset_entry
from src.data.seeded import SeededTransformDataset
from src.data.task_data import TaskData


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
