"""DATASETS: every value `data.name` can take, each registered once where its builder lives.

A dataset is one decorated builder that turns a DataConfig into a `Splits`:

    @DATASETS.register("mydata", task="segmentation", varying_sizes=True)
    def build_mydata(cfg: DataConfig) -> Splits:
        return Splits(train=..., val=..., class_names=[...])

Registration keywords (all optional except `task`), read by DataConfig.validate, build_datasets and
predict.py, so no other file keeps a list of dataset names:
- `num_classes`: the class count when the dataset fixes it (a different `data.num_classes` is an error);
  None when it is derived from the files or set by `data.num_classes`.
- `download`: torchvision can download it (`data.download=true` is allowed).
- `varying_sizes`: its images come in many sizes. Classification then trains on
  RandomResizedCrop(image_size) and evaluates Resize(resize_size) + CenterCrop(image_size) (ImageNet
  style); otherwise images are used at their size with padded random crops (CIFAR style).
  Segmentation evaluates each image at its own size either way.
- `encoded_files`: classification whose training split has torchvision ImageFolder's `samples` and
  `loader`, so `data.decode_on_device` may hand its JPEG files to the device undecoded.
- `check`: a function(DataConfig) raising ValueError for rules of this dataset alone.

A dataset whose files serve several tasks is registered with a tuple, e.g. `task=("detection",
"instance_segmentation")` for files with boxes and masks, and its builder is called as builder(cfg, handling),
with the run's task's TaskData, whose `target_keys` say what that task trains on (e.g. {"masks"}): the dataset
reads masks only when the model needs them.

Every module in src/data/datasets/ is imported when src.data is, so a new dataset is one file there
(plus its conf/data/<name>.yaml) and no other edit.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch.utils.data import Dataset

from src.registry import Entry, Registry

DATASETS = Registry("data.name")


@dataclass
class Splits:
    """What a dataset builder returns; transforms are added by build_datasets."""

    train: Dataset
    val: Dataset
    class_names: list[str]
    # Whether every validation sample has one size (so batches > 1 collate). Segmentation sets with
    # images of many sizes say False and are evaluated one image per batch, each at its own size.
    val_same_size: bool = True


def dataset_entry(name: str) -> Entry:
    """The registration of `name`; ValueError listing every registered dataset otherwise."""
    try:
        return DATASETS.get(name)
    except ValueError as exc:
        raise ValueError(f"{exc} (pick a file from conf/data/, e.g. data=shapes, or register a dataset: "
                         "docs/data.md, 'Add your own dataset')") from None


def dataset_task(name: str) -> str:
    """The (first) task of a `data.name`, e.g. "classification"; ValueError naming the valid names otherwise."""
    return dataset_entry(name).task


def dataset_tasks(name: str) -> tuple[str, ...]:
    """Every task a `data.name` serves; ValueError naming the valid names otherwise."""
    return dataset_entry(name).tasks
