"""Example folders in the layouts `data=imagefolder` and `data=segfolder` read, drawn by the shapes generator.

They let a new user try "train on your own data" and predict.py before pointing them at real files
(docs/data.md), and give the tests real image files: JPEG images, palette-PNG masks, images of several
sizes, a classes.txt.

    classify/{train,val}/<shape>/<n>.jpg                 one dominant shape per image, 6 classes
    segment/{train,val}/images/<n>.jpg                   several shapes per image, 48..80 px per side
    segment/{train,val}/masks/<n>.png                    palette PNG: 0 = background, k = shape kind k
    segment/classes.txt                                  background, circle, square, triangle, star
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from src.data import shapes

CLASSIFY_KINDS = shapes.DEFAULT_CLASSIFICATION_KINDS
SEGMENT_KINDS = shapes.DEFAULT_SEGMENTATION_KINDS
IMAGE_SIDE = 64
JPEG_QUALITY = 95


def write_classify(out: Path, train_per_class: int = 1000, val_per_class: int = 100, seed: int = 0) -> Path:
    """An ImageFolder tree under out/classify; returns that folder."""
    root = Path(out) / "classify"
    for split, per_class in (("train", train_per_class), ("val", val_per_class)):
        for index in range(per_class * CLASSIFY_KINDS):
            img, label = shapes.make_classification_image(seed, split, index, IMAGE_SIDE, CLASSIFY_KINDS)
            path = root / split / shapes.SHAPE_NAMES[label] / f"{index:05d}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(img).save(path, quality=JPEG_QUALITY)
    return root


def write_segment(out: Path, train_images: int = 2000, val_images: int = 300, seed: int = 0) -> Path:
    """A segfolder tree under out/segment (images of varying size, palette masks, classes.txt); returns it."""
    from src.data.palette import save_mask_png  # the same palette PNG writer as predict.py and evaluate.py

    root = Path(out) / "segment"
    for split, count in (("train", train_images), ("val", val_images)):
        (root / split / "images").mkdir(parents=True, exist_ok=True)
        (root / split / "masks").mkdir(parents=True, exist_ok=True)
        for index in range(count):
            img, mask = shapes.make_segmentation_image(seed, split, index, IMAGE_SIDE, SEGMENT_KINDS,
                                                       variable_size=True, radius_range=(0.15, 0.28))
            Image.fromarray(img).save(root / split / "images" / f"{index:05d}.jpg", quality=JPEG_QUALITY)
            save_mask_png(root / split / "masks" / f"{index:05d}.png", np.asarray(mask))
    names = ["background", *shapes.SHAPE_NAMES[:SEGMENT_KINDS]]
    (root / "classes.txt").write_text("\n".join(names) + "\n", encoding="utf-8")
    return root
