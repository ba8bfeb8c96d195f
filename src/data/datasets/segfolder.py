"""Your own segmentation data (`data=segfolder`): images and index masks in plain folders.

    <data.root>/
        classes.txt                 optional: one class name per line, line k names mask value k
        train/images/**/<name>.jpg  any of .jpg .jpeg .png .bmp .tif .tiff .webp .ppm .pgm, any size
        train/masks/**/<name>.png   same relative path and name (+ data.mask_suffix), lossless, same size
        val/images/...  val/masks/...

A mask holds each pixel's class index (palette PNG as in Pascal VOC, or 8-bit grayscale); 255 marks
pixels to ignore. Everything is checked when the dataset is built, before training starts: every image
has exactly one mask and the reverse, each mask has its image's size, and every mask value is a class
or 255. Each error names the offending files. The check reads every mask once; under torchrun the ranks
share that work (each reads its own contiguous part, the findings are all-gathered), so all ranks raise
the same error together instead of one rank hanging the others.

Classes: from the classes file (data.classes_file, default <root>/classes.txt when present), else
data.num_classes numbered classes ("0", "1", ...), else the largest mask value + 1.
Training and evaluation are those of VOC: joint random scale / crop / flip, and exact evaluation of
every validation image at its own size.
"""
from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision import tv_tensors

from src import comm
from src.data.config import DataConfig
from src.data.demo_folders import DemoFolder
from src.data.download import require_dir, resolve_root
from src.data.image_files import IMAGE_EXTENSIONS, MASK_EXTENSIONS, has_extension, list_files, load_mask, load_rgb
from src.data.registry import DATASETS, Splits
from src.data.samplers import ExactEvalSampler
from src.data.segmentation.demo_folders import write_segment
from src.data.segmentation.masks import IGNORE_INDEX
from src.data.transforms import to_image
from src.errors import MissingFileError

log = logging.getLogger(__name__)

CLASSES_FILE = "classes.txt"
_SHOWN = 8  # files named per problem in an error message


class SegFolderDataset(Dataset):
    """(tv_tensors.Image uint8 [3, H, W], tv_tensors.Mask uint8 [H, W]) for each (image, mask) file pair."""

    def __init__(self, pairs: list[tuple[Path, Path]]) -> None:
        self.images = [p[0] for p in pairs]
        self.masks = [p[1] for p in pairs]

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[tv_tensors.Image, tv_tensors.Mask]:
        image = to_image(load_rgb(self.images[index]))
        return image, tv_tensors.Mask(torch.from_numpy(load_mask(self.masks[index])))


@dataclass
class _Facts:
    """What the check learned about one (image, mask) pair."""

    image_size: tuple[int, int] = (0, 0)  # (width, height), from the image header
    mask_size: tuple[int, int] = (0, 0)
    values: tuple[int, ...] = ()  # distinct mask values
    error: Optional[str] = None  # the file could not be read as an image / index mask


@dataclass
class SegfolderOptions:
    """The `data` keys segfolder reads."""

    # masks/<image path without extension><mask_suffix>.png, e.g. "_mask" for a_mask.png.
    mask_suffix: str = ""
    # One class name per line (line k names mask value k); relative paths are relative to data.root;
    # null = <root>/classes.txt when present, else classes numbered 0..num_classes-1.
    classes_file: Optional[str] = None


def _check_cfg(cfg: DataConfig) -> None:
    if cfg.num_classes is not None and cfg.num_classes > IGNORE_INDEX:
        raise ValueError(f"data.num_classes={cfg.num_classes}: segfolder masks are 8-bit, so at most "
                         f"{IGNORE_INDEX} classes (0..{IGNORE_INDEX - 1}; {IGNORE_INDEX} = ignore)")


@DATASETS.register("segfolder", task="segmentation", varying_sizes=True, check=_check_cfg, options=SegfolderOptions,
                   demo=DemoFolder("segment", write_segment, 2000, 300, "image/mask pairs"))
def build_segfolder(cfg: DataConfig) -> Splits:
    """Pairs images with masks, checks them all (see the module docstring) and derives the classes."""
    root = resolve_root(cfg.root)
    splits = {split: pair_files(root / split, cfg.mask_suffix) for split in (cfg.train_split, cfg.val_split)}
    train_pairs, val_pairs = splits[cfg.train_split], splits[cfg.val_split]
    facts = _inspect_all(train_pairs + val_pairs)
    _raise_unreadable(facts, root)
    _raise_size_mismatches(train_pairs + val_pairs, facts, root)
    largest = max((v for f in facts for v in f.values if v != IGNORE_INDEX), default=0)
    names, source = class_names(cfg, root, largest)
    _raise_values_outside(train_pairs + val_pairs, facts, len(names), source, root)
    val_sizes = {f.image_size for f in facts[len(train_pairs):]}
    log.info("segfolder %s: %d training and %d validation images, %d classes (%s), validation images of %s",
             root, len(train_pairs), len(val_pairs), len(names), source,
             "one size" if len(val_sizes) == 1 else f"{len(val_sizes)} sizes (evaluated one per batch)")
    return Splits(SegFolderDataset(train_pairs), SegFolderDataset(val_pairs), names,
                  val_same_size=len(val_sizes) == 1)


def pair_files(split_dir: Path, mask_suffix: str = "") -> list[tuple[Path, Path]]:
    """(image, mask) paths of one split, sorted by relative path; errors name unpaired or ambiguous files."""
    images_dir, masks_dir = split_dir / "images", split_dir / "masks"
    how = ("segfolder expects <root>/<split>/images/ and <root>/<split>/masks/, a mask per image with the same "
           "relative path and name (see docs/data.md); set data.root")
    require_dir(images_dir, "segfolder images", how)
    require_dir(masks_dir, "segfolder masks", how)
    images = _by_key(list_files(images_dir, IMAGE_EXTENSIONS), images_dir, "")
    if not images:
        raise MissingFileError(f"no images in {images_dir.resolve()} (looked for {', '.join(IMAGE_EXTENSIONS)}, "
                               "in any case, also in sub-folders)")
    mask_files = list_files(masks_dir, IMAGE_EXTENSIONS)
    lossy = [m for m in mask_files if not has_extension(m, MASK_EXTENSIONS)]
    if lossy:
        raise ValueError(f"{len(lossy)} mask(s) are in a lossy format ({_list([masks_dir / m for m in lossy])}): "
                         "JPEG/WebP compression changes class indices at every edge; save masks as PNG")
    suffixed = [m.with_suffix("").name.endswith(mask_suffix) for m in mask_files]
    unsuffixed = [m for m, ok in zip(mask_files, suffixed) if not ok]
    masks = _by_key([m for m, ok in zip(mask_files, suffixed) if ok], masks_dir, mask_suffix)
    missing = sorted(set(images) - set(masks))
    extra = sorted(set(masks) - set(images))
    if missing or extra or unsuffixed:
        problems = []
        if missing:
            problems.append(f"{len(missing)} image(s) without a mask: {_list([images_dir / images[k] for k in missing])}")
        if extra:
            problems.append(f"{len(extra)} mask(s) without an image: {_list([masks_dir / masks[k] for k in extra])}")
        if unsuffixed:
            problems.append(f"{len(unsuffixed)} mask(s) not ending in data.mask_suffix={mask_suffix!r}: "
                            f"{_list([masks_dir / m for m in unsuffixed])}")
        raise ValueError(f"{split_dir.resolve()}: images and masks do not pair up: {'; '.join(problems)}. "
                         f"Image images/<path>/<name>.<ext> needs the mask masks/<path>/<name>{mask_suffix}.png")
    return [(images_dir / images[k], masks_dir / masks[k]) for k in sorted(images)]


def _by_key(files: list[Path], folder: Path, suffix: str) -> dict[str, Path]:
    """Relative path without extension (and without `suffix`) -> file; two files with one key are an error."""
    out: dict[str, Path] = {}
    for f in files:
        key = f.with_suffix("").as_posix()
        key = key[: len(key) - len(suffix)] if suffix else key
        if key in out:
            raise ValueError(f"{folder.resolve()}: {out[key]} and {f} have the same name; keep one of them")
        out[key] = f
    return out


def class_names(cfg: DataConfig, root: Path, largest_value: int) -> tuple[list[str], str]:
    """The class names and where they came from (the classes file, data.num_classes or the masks)."""
    path: Optional[Path] = None
    if cfg.classes_file:
        path = Path(os.path.expanduser(cfg.classes_file))
        path = path if path.is_absolute() else root / path
        if not path.is_file():
            raise MissingFileError(f"data.classes_file={cfg.classes_file}: no file at {path.resolve()}")
    elif (root / CLASSES_FILE).is_file():
        path = root / CLASSES_FILE
    if path is not None:
        names = _read_class_names(path)
        if cfg.num_classes is not None and cfg.num_classes != len(names):
            raise ValueError(f"data.num_classes={cfg.num_classes} but {path.resolve()} names {len(names)} classes; "
                             "remove the override or fix the file")
        return names, f"named in {path}"
    if cfg.num_classes is not None:
        return [str(i) for i in range(cfg.num_classes)], "data.num_classes"
    if largest_value < 1:
        raise ValueError(f"every mask under {root.resolve()} holds only class 0 (and {IGNORE_INDEX} = ignore): "
                         "segmentation needs at least two classes; set data.num_classes or write "
                         f"{(root / CLASSES_FILE).resolve()}")
    return [str(i) for i in range(largest_value + 1)], "largest mask value + 1"


def _read_class_names(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8").rstrip().splitlines()
    names = [line.strip() for line in lines]
    if any(not n for n in names):
        raise ValueError(f"{path.resolve()} has an empty line {names.index('')}: line k names mask value k, "
                         "so every line up to the last needs a name")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"{path.resolve()} names these classes more than once: {duplicates}")
    if not 2 <= len(names) <= IGNORE_INDEX:
        raise ValueError(f"{path.resolve()} names {len(names)} classes; segfolder needs 2..{IGNORE_INDEX} "
                         f"(mask values 0..{IGNORE_INDEX - 1}, {IGNORE_INDEX} = ignore)")
    return names


def _inspect(pair: tuple[Path, Path]) -> _Facts:
    image, mask = pair
    try:
        with Image.open(image) as img:
            size = img.size  # the header only: decoding waits for training
    except (OSError, ValueError, SyntaxError) as exc:
        return _Facts(error=f"cannot read image {image}: {exc}")
    try:
        arr = load_mask(mask)
    except (OSError, ValueError) as exc:
        return _Facts(error=str(exc))
    present = np.flatnonzero(np.bincount(arr.ravel(), minlength=256))
    return _Facts(size, (arr.shape[1], arr.shape[0]), tuple(int(v) for v in present))


def _inspect_all(pairs: list[tuple[Path, Path]]) -> list[_Facts]:
    """_inspect of every pair, the work shared among the ranks (a collective when distributed)."""
    shard = ExactEvalSampler(len(pairs), comm.get_rank(), comm.get_world_size())
    # Decoding PNGs releases the GIL, so threads help; this node's cores are shared by its ranks.
    threads = max(1, min(8, (os.cpu_count() or 1) // comm.get_local_world_size()))
    with ThreadPoolExecutor(max_workers=threads) as pool:
        mine = list(pool.map(_inspect, pairs[shard.start:shard.stop]))
    return [f for part in comm.all_gather_object(mine) for f in part]


def _raise_unreadable(facts: list[_Facts], root: Path) -> None:
    bad = [f.error for f in facts if f.error]
    if bad:
        shown = "; ".join(bad[:_SHOWN]) + (f"; and {len(bad) - _SHOWN} more" if len(bad) > _SHOWN else "")
        raise ValueError(f"segfolder {root.resolve()}: {len(bad)} file(s) are not usable: {shown}")


def _raise_size_mismatches(pairs: list[tuple[Path, Path]], facts: list[_Facts], root: Path) -> None:
    bad = [(p, f) for p, f in zip(pairs, facts) if f.image_size != f.mask_size]
    if bad:
        shown = [f"{m} is {fm.mask_size[0]}x{fm.mask_size[1]} but {i.name} is {fm.image_size[0]}x{fm.image_size[1]}"
                 for (i, m), fm in bad[:_SHOWN]]
        raise ValueError(f"segfolder {root.resolve()}: {len(bad)} mask(s) differ in size from their image "
                         f"(width x height): {'; '.join(shown)}{' ...' if len(bad) > _SHOWN else ''}; a mask must "
                         "have its image's size (was an image resized or rotated after labelling?)")


def _raise_values_outside(pairs: list[tuple[Path, Path]], facts: list[_Facts], num_classes: int, source: str,
                          root: Path) -> None:
    bad = []
    for (_, mask), f in zip(pairs, facts):
        outside = [v for v in f.values if v >= num_classes and v != IGNORE_INDEX]
        if outside:
            bad.append(f"{mask} has {outside[:10]}")
    if bad:
        raise ValueError(
            f"segfolder {root.resolve()}: {len(bad)} mask(s) hold values that are not one of the {num_classes} "
            f"classes 0..{num_classes - 1} ({source}) nor {IGNORE_INDEX} (ignore): {'; '.join(bad[:_SHOWN])}"
            f"{' ...' if len(bad) > _SHOWN else ''}. Fix those masks, or raise data.num_classes / add names to "
            "the classes file")


def _list(paths: list[Path]) -> str:
    shown = ", ".join(str(p) for p in paths[:_SHOWN])
    return shown + (f" and {len(paths) - _SHOWN} more" if len(paths) > _SHOWN else "")
