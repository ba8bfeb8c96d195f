"""ImageNet-style class folders (`data=imagefolder`): <root>/<split>/<class>/**/<image>, for your own images too.

torchvision's ImageFolder, with three things real folders need:
- hidden entries are skipped: a `.ipynb_checkpoints/` next to the class folders would otherwise become a
  class, and macOS `._photo.jpg` files (not images) would fail at the first epoch;
- the validation split is labelled with the training split's class indices. torchvision numbers each
  folder's classes on its own, so a validation split lacking one class would shift every later label by
  one; here a class missing from validation is allowed (logged), and a validation class that training
  never saw is an error;
- an unreadable image names its file.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from PIL import Image
from torchvision import datasets

from src.data.config import DataConfig
from src.data.datasets.shapes import drawing
from src.data.demo_folders import IMAGE_SIDE, JPEG_QUALITY, DemoFolder
from src.data.download import require_dir, resolve_root
from src.data.image_files import IMAGE_EXTENSIONS, has_extension, is_hidden, load_rgb
from src.data.registry import DATASETS, Splits
from src.errors import MissingFileError

log = logging.getLogger(__name__)


def class_folders(split_dir: Path) -> list[str]:
    """Sorted names of the class sub-folders (hidden ones skipped)."""
    return sorted(e.name for e in os.scandir(split_dir) if e.is_dir() and not is_hidden(e.name))


class ClassFolders(datasets.ImageFolder):
    """torchvision's ImageFolder over the given classes (label = index in `classes`), hidden files skipped."""

    def __init__(self, root: Path, classes: list[str], allow_empty: bool = False) -> None:
        self._given_classes = list(classes)
        root = Path(root)

        def is_valid_file(path: str) -> bool:
            parts = Path(path).relative_to(root).parts
            return has_extension(path, IMAGE_EXTENSIONS) and not any(is_hidden(p) for p in parts)

        super().__init__(str(root), loader=load_rgb, is_valid_file=is_valid_file, allow_empty=allow_empty)

    def find_classes(self, directory: str) -> tuple[list[str], dict[str, int]]:
        """The classes given to the constructor, not the folders found (see the module docstring)."""
        return self._given_classes, {c: i for i, c in enumerate(self._given_classes)}


def write_classify(out: Path, train_per_class: int = 1000, val_per_class: int = 100, seed: int = 0) -> Path:
    """An example tree under out/classify, one dominant shape per image, 6 classes:
    classify/{train,val}/<shape>/<n>.jpg. Returns that folder."""
    kinds = drawing.DEFAULT_CLASSIFICATION_KINDS
    root = Path(out) / "classify"
    for split, per_class in (("train", train_per_class), ("val", val_per_class)):
        for index in range(per_class * kinds):
            img, label = drawing.make_classification_image(seed, split, index, IMAGE_SIDE, kinds)
            path = root / split / drawing.SHAPE_NAMES[label] / f"{index:05d}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(img).save(path, quality=JPEG_QUALITY)
    return root


# encoded_files: the training split's `samples` are files that data.decode_on_device may hand over undecoded.
@DATASETS.register("imagefolder", task="classification", varying_sizes=True, encoded_files=True,
                   demo=DemoFolder("classify", write_classify, 1000, 100, "JPEGs per class, 6 classes"))
def build_imagefolder(cfg: DataConfig) -> Splits:
    """<root>/<train_split>/<class>/... and <root>/<val_split>/<class>/...; classes = training sub-folders."""
    root = resolve_root(cfg.root)
    how = "one sub-folder per class holding its images, e.g. <root>/train/n01440764/*.JPEG; set data.root"
    train_dir, val_dir = root / cfg.train_split, root / cfg.val_split
    require_dir(train_dir, "ImageFolder training split", how)
    require_dir(val_dir, "ImageFolder validation split", how)
    classes = class_folders(train_dir)
    if len(classes) < 2:
        raise ValueError(f"{train_dir.resolve()} has {len(classes)} class folder(s) ({classes}); classification "
                         "needs one sub-folder per class, at least two")
    unknown = sorted(set(class_folders(val_dir)) - set(classes))
    if unknown:
        raise ValueError(f"{val_dir.resolve()} has class folders that {train_dir.resolve()} lacks: {unknown[:10]}"
                         f"{' ...' if len(unknown) > 10 else ''}; both splits need the same class sub-folders "
                         "(a class may be absent from validation, not from training)")
    if cfg.num_classes is not None and cfg.num_classes != len(classes):
        raise ValueError(f"data.num_classes={cfg.num_classes} but {train_dir.resolve()} has {len(classes)} class "
                         "folders; remove the override (it is derived) or fix the folders")
    train = _folder(train_dir, classes, "training")
    val = _folder(val_dir, classes, "validation", allow_empty=True)
    absent = sorted(set(classes) - {classes[t] for t in val.targets})
    if absent:
        log.warning("imagefolder: %d class(es) have no validation images: %s%s", len(absent), absent[:10],
                    " ..." if len(absent) > 10 else "")
    return Splits(train, val, classes)


def _folder(split_dir: Path, classes: list[str], what: str, allow_empty: bool = False) -> Any:
    try:
        folder = ClassFolders(split_dir, classes, allow_empty=allow_empty)
    except FileNotFoundError as exc:  # torchvision: "Found no valid file for the classes ..."
        raise MissingFileError(f"{what} split {split_dir.resolve()}: {exc}") from exc
    if len(folder) == 0:
        raise MissingFileError(f"{what} split {split_dir.resolve()} holds no images "
                               f"({', '.join(IMAGE_EXTENSIONS)}) in its class folders")
    return folder
