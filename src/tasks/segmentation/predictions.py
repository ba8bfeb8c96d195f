"""predict.py's segmentation output: out/<relative path>.png with the extension replaced (photos/a.jpg ->
out/photos/a.png); when two inputs in one folder differ only in extension (a.jpg, a.png), both keep it
(a.jpg.png, a.png.png). draw=true adds each input with its mask over it under out/overlays/, named alike."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

OVERLAYS_FOLDER = "overlays"  # predict.py draw=true: the inputs with their masks over them


def mask_names(relative: list[Path]) -> list[Path]:
    """The output path (relative to out/) of each input's mask: extension -> .png, unless two would collide."""
    plain = [r.with_suffix(".png") for r in relative]
    taken = Counter(plain)
    return [p if taken[p] == 1 else r.with_name(r.name + ".png") for r, p in zip(relative, plain)]


def overlay_names(relative: list[Path]) -> list[Path]:
    """The output path (relative to out/) of each input's overlay picture: overlays/<its mask's name>."""
    return [OVERLAYS_FOLDER / name for name in mask_names(relative)]
