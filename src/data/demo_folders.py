"""Example folders in the layouts that datasets on disk read, drawn by the shapes generator.

They let a new user try "train on your own data" and predict.py before pointing them at real files
(docs/data.md), and give the tests real image files. A dataset that reads such a tree registers how to write
one (`@DATASETS.register(..., demo=DemoFolder(...))`, next to its builder); scripts/make_demo_folders.py
writes every registered tree.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from src.data.registry import DATASETS

JPEG_QUALITY = 95
IMAGE_SIDE = 64


@dataclass(frozen=True)
class DemoFolder:
    """An example tree for one dataset: written by `write(out, train, val, seed)` under out/<folder>."""

    folder: str
    write: Callable[[Path, int, int, int], Path]  # returns the tree's root, the dataset's data.root
    train: int  # default sizes, in the tree's `unit`
    val: int
    unit: str  # what `train` and `val` count, e.g. "images per class"


def demo_folders() -> dict[str, DemoFolder]:
    """Every registered example tree, by the data.name that reads it."""
    return {entry.name: entry.info["demo"] for entry in DATASETS if entry.info.get("demo") is not None}
