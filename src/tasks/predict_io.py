"""predict.py's inputs: which files, in which order, read how (each task writes its own outputs).

Inputs: one image file, or every image under a folder (recursively; hidden files and folders skipped,
extensions as ImageFolder's in any case), sorted by relative path, so the order, and therefore each
rank's shard, is the same on every process. Outputs keep the relative path (the tasks' predictions.py).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils.data import Dataset

from src.data.image_files import IMAGE_EXTENSIONS, list_files, load_rgb
from src.errors import MissingFileError


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
