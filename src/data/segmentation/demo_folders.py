"""data=segfolder's example tree, drawn by the shapes generator: several shapes per image, images of varying
sizes, palette-PNG masks and a classes.txt (src/data/demo_folders.py).

    segment/{train,val}/images/<n>.jpg                   several shapes per image, 48..80 px per side
    segment/{train,val}/masks/<n>.png                    palette PNG: 0 = background, k = shape kind k
    segment/classes.txt                                  background, circle, square, triangle, star
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from src.data.datasets.shapes import drawing
from src.data.demo_folders import IMAGE_SIDE, JPEG_QUALITY
from src.data.segmentation.palette import save_mask_png  # the same palette PNG writer as predict.py's

SEGMENT_KINDS = drawing.DEFAULT_SEGMENTATION_KINDS


def write_segment(out: Path, train_images: int = 2000, val_images: int = 300, seed: int = 0) -> Path:
    """A segfolder tree under out/segment (images of varying size, palette masks, classes.txt); returns it."""
    root = Path(out) / "segment"
    for split, count in (("train", train_images), ("val", val_images)):
        (root / split / "images").mkdir(parents=True, exist_ok=True)
        (root / split / "masks").mkdir(parents=True, exist_ok=True)
        for index in range(count):
            img, mask = drawing.make_segmentation_image(seed, split, index, IMAGE_SIDE, SEGMENT_KINDS,
                                                       variable_size=True, radius_range=(0.15, 0.28))
            Image.fromarray(img).save(root / split / "images" / f"{index:05d}.jpg", quality=JPEG_QUALITY)
            save_mask_png(root / split / "masks" / f"{index:05d}.png", np.asarray(mask))
    names = ["background", *drawing.SHAPE_NAMES[:SEGMENT_KINDS]]
    (root / "classes.txt").write_text("\n".join(names) + "\n", encoding="utf-8")
    return root
