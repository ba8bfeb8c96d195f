"""predict.py's inputs: which files, in which order, read how (each task writes its own outputs).

Inputs: one image file, or every image under a folder (recursively; hidden files and folders skipped,
extensions as ImageFolder's in any case), sorted by relative path, so the order, and therefore each
rank's shard, is the same on every process. Outputs keep the relative path (the tasks' predictions.py).

Files that cannot be decoded (cut short, not an image) are found before predicting (`decode_error`, each file
decoded once, JPEGs at 1/8 scale, which still reads their whole bitstream), so that predict.py can skip them and
every task sees only readable inputs; `write_unreadable` lists them in the output folder.
"""
from __future__ import annotations

import csv
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from PIL import Image
from torch.utils.data import Dataset

from src.data.image_files import DECODE_ERRORS, IMAGE_EXTENSIONS, list_files, load_rgb
from src.errors import MissingFileError

UNREADABLE_CSV = "unreadable.csv"  # predict.py: the inputs it skipped, and why


def list_inputs(source: Path, out_dir: Path | None = None) -> tuple[Path, list[Path]]:
    """(base folder, relative paths of the images to predict); errors say what was expected.

    A file is predicted whatever its extension (PIL decides whether it can read it). Files under
    `out_dir` are skipped when it lies inside `source`, so a second run does not predict its own masks.
    """
    if source.is_file():
        return source.parent, [Path(source.name)]
    if not source.is_dir():
        raise MissingFileError(f"input={source}: no such file or folder; pass an image file or a folder of images")
    found = list_files(source, IMAGE_EXTENSIONS)
    if out_dir is not None:
        try:
            inside = out_dir.resolve().relative_to(source.resolve())
        except ValueError:
            inside = None
        if inside is not None and inside.parts:
            found = [f for f in found if f.parts[: len(inside.parts)] != inside.parts]
    if not found:
        raise MissingFileError(f"input={source}: no images found (looked for {', '.join(IMAGE_EXTENSIONS)} in any "
                               "case, also in sub-folders; hidden files are skipped)")
    return source, found


class ImageFiles(Dataset):
    """(transformed image, None, index) for each file, read as RGB (the training data's loader)."""

    def __init__(self, base: Path, relative: list[Path], transform: Callable[[Any], torch.Tensor]) -> None:
        self.paths = [base / r for r in relative]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, None, int]:
        """(image, no target, index): the samples a task's collation makes a Batch of."""
        image = self.transform(load_rgb(self.paths[index]))
        return image.as_subclass(torch.Tensor), None, index


def decode_error(path: Path) -> str | None:
    """Why the image at `path` cannot be decoded (PIL's message), or None when it can. A JPEG is decoded at 1/8 of its
    size (PIL's draft mode: the whole bitstream is still read, so a cut-off file fails), other formats in full."""
    try:
        with Image.open(path) as img:
            img.draft("RGB", (max(1, img.width // 8), max(1, img.height // 8)))  # a no-op for formats without one
            img.load()
    except DECODE_ERRORS as exc:
        return str(exc) or type(exc).__name__
    return None


def find_unreadable(base: Path, relative: Sequence[Path], indices: Sequence[int],
                    threads: int = 1) -> list[tuple[int, str]]:
    """(index, reason) of each of `indices` whose file `base / relative[index]` cannot be decoded, on `threads`
    threads (PIL decodes without holding the GIL)."""
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        reasons = pool.map(lambda i: decode_error(base / relative[i]), indices)
        return [(i, reason) for i, reason in zip(indices, reasons) if reason is not None]


def write_unreadable(path: Path, rows: Sequence[tuple[str, str]]) -> None:
    """The skipped inputs as CSV: a header (file, error), then one row per file (its path as given, PIL's reason)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["file", "error"])
        writer.writerows(rows)
