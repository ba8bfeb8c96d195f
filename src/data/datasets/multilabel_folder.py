"""Your multi-label images (`data=multilabel_folder`): <root>/<split>/labels.csv and the images it lists.

    <root>/train/labels.csv     file,labels: each image's path relative to train/ and its labels (spaces between)
    <root>/train/...            the images, in any layout
    <root>/val/labels.csv
    <root>/val/...

The classes are the labels of the training split, sorted by name; a validation label that training never saw is an
error (the model could not predict it). The format is src/data/multilabel/labels_csv.py's (docs/data.md).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from src.data.config import DataConfig
from src.data.download import require_dir, resolve_root
from src.data.image_files import load_rgb
from src.data.multilabel.labels_csv import LABELS_CSV, LabelledImage, multi_hot, read_labels_csv
from src.data.registry import DATASETS, Splits
from src.errors import UserError

HOW = "a labels.csv (columns file,labels) and the images it lists; set data.root (docs/data.md)"


class LabelledFiles(Dataset):
    """(PIL RGB image, float32 multi-hot [K]) for each row of a labels.csv, in the CSV's order."""

    def __init__(self, rows: list[LabelledImage], classes: list[str]) -> None:
        self.rows, self.classes = rows, list(classes)
        index = {name: i for i, name in enumerate(self.classes)}
        self.targets = [multi_hot(row.labels, index) for row in rows]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> tuple[Any, torch.Tensor]:
        return load_rgb(self.rows[i].path), self.targets[i]


def _split(root: Path, split: str, what: str) -> list[LabelledImage]:
    folder = root / split
    require_dir(folder, f"multilabel_folder {what} split", HOW)
    csv_file = folder / LABELS_CSV
    if not csv_file.is_file():
        raise FileNotFoundError(f"multilabel_folder {what} split: no {LABELS_CSV} in {folder.resolve()} ({HOW})")
    return read_labels_csv(csv_file)


@DATASETS.register("multilabel_folder", task="multilabel", varying_sizes=True)
def build_multilabel_folder(cfg: DataConfig) -> Splits:
    """<root>/<train_split>/labels.csv and <root>/<val_split>/labels.csv; classes = the training labels, sorted."""
    root = resolve_root(cfg.root)
    train, val = _split(root, cfg.train_split, "training"), _split(root, cfg.val_split, "validation")
    classes = sorted({label for row in train for label in row.labels})
    if not classes:
        raise UserError(f"{(root / cfg.train_split / LABELS_CSV).resolve()}: no image has a label; multi-label "
                        "training needs at least one class")
    unknown = sorted({label for row in val for label in row.labels} - set(classes))
    if unknown:
        raise UserError(f"{(root / cfg.val_split / LABELS_CSV).resolve()} has labels that no training image has: "
                        f"{unknown[:10]}{' ...' if len(unknown) > 10 else ''}; the model can only learn the training "
                        "split's classes")
    if cfg.num_classes is not None and cfg.num_classes != len(classes):
        raise UserError(f"data.num_classes={cfg.num_classes} but the training labels name {len(classes)} classes; "
                        "remove the override (it is derived)")
    return Splits(LabelledFiles(train, classes), LabelledFiles(val, classes), classes)
