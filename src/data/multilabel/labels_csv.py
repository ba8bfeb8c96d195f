"""A split's labels.csv (`data=multilabel_folder`): one row per image, its file and its labels.

    file,labels
    beach/0001.jpg,sea sky person
    city/0002.jpg,car person
    empty.jpg,

`file` is the image's path relative to the split folder (the CSV's folder); `labels` its class names, separated
by spaces (or `|` or `;`), none for an image that shows none of the classes. Other columns are ignored. Every error
names the file and the line, and what the row should hold.
"""
from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from src.errors import UserError

LABELS_CSV = "labels.csv"
COLUMNS = ("file", "labels")
_SEPARATORS = re.compile(r"[\s|;]+")


@dataclass(frozen=True)
class LabelledImage:
    """One row: the image file (a path) and its label names (in the CSV's order, without repeats)."""

    path: Path
    labels: tuple[str, ...]


def read_labels_csv(path: Path) -> list[LabelledImage]:
    """The rows of a labels.csv; UserError naming the file and the line for a bad header, an empty or repeated file
    name, or no rows; FileNotFoundError for a listed image that is not there."""
    where = path.resolve()
    with open(path, newline="", encoding="utf-8-sig") as f:  # utf-8-sig: a spreadsheet's byte-order mark
        reader = csv.DictReader(f)
        header = [h.strip() for h in reader.fieldnames or []]
        if not set(COLUMNS) <= set(header):
            raise UserError(f"{where}: the header must name the columns {','.join(COLUMNS)} (the image's path "
                            f"relative to {where.parent}, its labels separated by spaces), got {header}")
        reader.fieldnames = header
        rows: list[LabelledImage] = []
        seen: dict[str, int] = {}
        for row in reader:
            line = reader.line_num
            name = (row["file"] or "").strip()
            if not name:
                raise UserError(f"{where}:{line}: no file name; each row is <image path>,<labels>")
            if name in seen:
                raise UserError(f"{where}:{line}: {name} is listed again (first on line {seen[name]}); give each "
                                "image one row with all its labels")
            seen[name] = line
            image = path.parent / name
            if not image.is_file():
                raise FileNotFoundError(f"{where}:{line}: no image at {image.resolve()}")
            labels = [label for label in _SEPARATORS.split((row["labels"] or "").strip()) if label]
            rows.append(LabelledImage(image, tuple(dict.fromkeys(labels))))
    if not rows:
        raise UserError(f"{where}: no rows; list one image per row as <image path>,<labels>")
    return rows


def multi_hot(labels: tuple[str, ...], index: dict[str, int]) -> torch.Tensor:
    """float32 [K]: 1 for each label's class, 0 elsewhere (K = len(index))."""
    target = torch.zeros(len(index), dtype=torch.float32)
    target[[index[label] for label in labels]] = 1.0
    return target
