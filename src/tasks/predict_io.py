"""predict.py's files: which inputs, in which order, and where each prediction is written.

Inputs: one image file, or every image under a folder (recursively; hidden files and folders skipped,
extensions as ImageFolder's in any case), sorted by relative path, so the order, and therefore each
rank's shard, is the same on every process. Outputs keep the relative path:
- classification: out/predictions.csv, one row per input: file, then class_1, prob_1 ... class_k, prob_k
  (the k most probable classes, most probable first);
- segmentation: out/<relative path>.png with the extension replaced (photos/a.jpg -> out/photos/a.png);
  when two inputs in one folder differ only in extension (a.jpg, a.png), both keep it (a.jpg.png, a.png.png).
"""
from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils.data import Dataset

from src.data.image_files import IMAGE_EXTENSIONS, list_files, load_rgb

PREDICTIONS_CSV = "predictions.csv"


def list_inputs(source: Path, out_dir: Path | None = None) -> tuple[Path, list[Path]]:
    """(base folder, relative paths of the images to predict); errors say what was expected.

    A file is predicted whatever its extension (PIL decides whether it can read it). Files under
    `out_dir` are skipped when it lies inside `source`, so a second run does not predict its own masks.
    """
    if source.is_file():
        return source.parent, [Path(source.name)]
    if not source.is_dir():
        raise FileNotFoundError(f"input={source}: no such file or folder; pass an image file or a folder of images")
    found = list_files(source, IMAGE_EXTENSIONS)
    if out_dir is not None:
        try:
            inside = out_dir.resolve().relative_to(source.resolve())
        except ValueError:
            inside = None
        if inside is not None and inside.parts:
            found = [f for f in found if f.parts[: len(inside.parts)] != inside.parts]
    if not found:
        raise FileNotFoundError(f"input={source}: no images found (looked for {', '.join(IMAGE_EXTENSIONS)} in any "
                                "case, also in sub-folders; hidden files are skipped)")
    return source, found


def mask_names(relative: list[Path]) -> list[Path]:
    """The output path (relative to out/) of each input's mask: extension -> .png, unless two would collide."""
    plain = [r.with_suffix(".png") for r in relative]
    taken = Counter(plain)
    return [p if taken[p] == 1 else r.with_name(r.name + ".png") for r, p in zip(relative, plain)]


class ImageFiles(Dataset):
    """(transformed image, index) for each file, read as RGB (the training data's loader)."""

    def __init__(self, base: Path, relative: list[Path], transform: Callable[[Any], torch.Tensor]) -> None:
        self.paths = [base / r for r in relative]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = self.transform(load_rgb(self.paths[index]))
        return image.as_subclass(torch.Tensor), index


def write_predictions_csv(path: Path, files: list[str], classes: list[list[str]], probs: list[list[float]]) -> None:
    """The classification table: one row per file, k (class, probability) pairs per row."""
    k = len(classes[0]) if classes else 0
    header = ["file"] + [f"{name}_{i}" for i in range(1, k + 1) for name in ("class", "prob")]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)  # quotes class names or file names that contain commas
        writer.writerow(header)
        for file, names, ps in zip(files, classes, probs):
            writer.writerow([file] + [v for name, p in zip(names, ps) for v in (name, f"{p:.6f}")])
