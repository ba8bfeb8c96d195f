"""Image and mask files as users keep them: which files count, and reading them with errors that name the file.

Real folders hold more than images: `.DS_Store`, macOS `._name.jpg` resource forks (they end in .jpg but
are not images), `.ipynb_checkpoints/` copies, `Thumbs.db`, READMEs. Hidden files and folders (a name
starting with ".") are skipped everywhere; other files count when their extension (any case) is one
torchvision's ImageFolder accepts.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from torchvision.datasets.folder import IMG_EXTENSIONS

from src.errors import UserError

IMAGE_EXTENSIONS: tuple[str, ...] = tuple(IMG_EXTENSIONS)  # .jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp
# Masks must be stored losslessly: JPEG (and lossy WebP) blur the class indices at every edge.
MASK_EXTENSIONS: tuple[str, ...] = (".png", ".bmp", ".tif", ".tiff", ".pgm", ".ppm")
MAX_MASK_VALUE = 255  # masks are uint8; 255 is the ignore value


def is_hidden(name: str) -> bool:
    """True for names a file browser hides (".DS_Store", "._a.jpg", ".ipynb_checkpoints")."""
    return name.startswith(".")


def has_extension(path: str | Path, extensions: tuple[str, ...]) -> bool:
    """True when the file name ends with one of `extensions`, ignoring case (".JPEG" counts as ".jpeg")."""
    return str(path).lower().endswith(extensions)


def list_files(root: Path, extensions: tuple[str, ...]) -> list[Path]:
    """Files under `root` (recursively, following links) with one of `extensions`, as sorted relative paths.

    Hidden files and everything inside hidden folders are skipped.
    """
    found = []
    for folder, dirs, files in os.walk(root, followlinks=True):
        dirs[:] = [d for d in dirs if not is_hidden(d)]
        rel = Path(folder).relative_to(root)
        found += [rel / f for f in files if not is_hidden(f) and has_extension(f, extensions)]
    return sorted(found)


# PIL's errors for corrupt, truncated or unknown files (and numpy's for a decode that stops short).
DECODE_ERRORS: tuple[type[BaseException], ...] = (OSError, ValueError, SyntaxError)


class UnreadableImage(UserError, OSError):
    """A file that cannot be decoded (corrupt, truncated, not an image); the message names it and, once the
    dataset has added it (`at`), where in the data it is: "cannot read image <path> (<where>): <reason>".
    A mistake in the user's data (one message, no traceback, src/errors.py), and still an OSError.

    One positional argument, as every OSError: torch re-raises a DataLoader worker's error in the main process
    as `type(err)(message)`.
    """

    def __init__(self, message: str, *, path: str | Path | None = None, kind: str = "image",
                 reason: str = "") -> None:
        super().__init__(message)
        self.path, self.kind, self.reason = path, kind, reason

    @classmethod
    def of(cls, path: str | Path, reason: object, kind: str = "image", where: str = "") -> "UnreadableImage":
        """The error for `path` that could not be decoded because of `reason` (PIL's error)."""
        place = f" ({where})" if where else ""
        return cls(f"cannot read {kind} {path}{place}: {reason}", path=path, kind=kind, reason=str(reason))

    def at(self, where: str) -> "UnreadableImage":
        """The same error, also saying where the file is in the data (e.g. "training split 'train', sample 7")."""
        if self.path is None:  # re-raised from a worker: only the message travelled
            return UnreadableImage(f"{self} ({where})")
        return UnreadableImage.of(self.path, self.reason, self.kind, where)


def read_sample(dataset: Any, index: int, where: str) -> Any:
    """`dataset[index]`; a file it cannot decode raises UnreadableImage naming the file, `where` and the index."""
    try:
        return dataset[index]
    except UnreadableImage as exc:
        raise exc.at(f"{where}, sample {index}") from exc.__cause__


def load_rgb(path: str | Path) -> Image.Image:
    """The image at `path` as RGB (grayscale, palette, CMYK and alpha images converted); errors name the file."""
    try:
        with Image.open(path) as img:
            return img.convert("RGB")
    except DECODE_ERRORS as exc:
        raise UnreadableImage.of(path, exc) from exc


def load_mask(path: str | Path) -> np.ndarray:
    """A [H, W] uint8 array of class indices from an index mask; ValueError naming the file when it is not one.

    Accepted: palette PNGs (the palette indices are the classes, as in Pascal VOC), grayscale 8-bit or
    16-bit (pixel value = class, at most 255), 1-bit, and RGB whose three channels are equal (a grayscale
    mask saved as colour). Colour-coded RGB masks are refused: the colour -> class mapping is not in the file.
    """
    try:
        with Image.open(path) as img:
            mode = img.mode
            arr = np.array(img)  # a writable copy: torch.from_numpy warns on read-only arrays
    except DECODE_ERRORS as exc:
        raise UnreadableImage.of(path, exc, kind="mask") from exc
    if mode in ("P", "L"):
        return np.ascontiguousarray(arr, dtype=np.uint8)
    if mode == "1":
        return arr.astype(np.uint8)
    if mode.startswith("I"):  # I;16, I;16B, I (32-bit): fine while every value fits in uint8
        big = int(arr.max()) if arr.size else 0
        if big > MAX_MASK_VALUE or (arr.size and int(arr.min()) < 0):
            raise ValueError(f"mask {path} ({mode}) has pixel value {big}: class indices must be 0..254, "
                             "with 255 = ignore")
        return arr.astype(np.uint8)
    if mode == "RGB" and arr.ndim == 3 and (arr[..., 0] == arr[..., 1]).all() and (arr[..., 0] == arr[..., 2]).all():
        return np.ascontiguousarray(arr[..., 0])
    raise ValueError(
        f"mask {path} is a {mode} image with colours, not an index mask: every pixel must hold its class index "
        "(0, 1, 2, ...; 255 = ignore). Save masks as palette PNGs (PIL mode 'P', like Pascal VOC) or 8-bit "
        "grayscale PNGs (mode 'L'); colour-coded masks need their colours mapped to indices first")
