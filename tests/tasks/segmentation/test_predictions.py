"""predict.py's segmentation output names: one mask per input, never two on one path."""
from __future__ import annotations

from pathlib import Path

from src.tasks.segmentation.predictions import mask_names


def test_mask_names_keep_folders_and_never_collide() -> None:
    rel = [Path("a.jpg"), Path("a.png"), Path("x/a.jpg"), Path("y/a.jpg"), Path("z/b.tif")]
    names = mask_names(rel)
    assert names == [Path("a.jpg.png"), Path("a.png.png"), Path("x/a.png"), Path("y/a.png"), Path("z/b.png")]
    assert len(set(names)) == len(names)
