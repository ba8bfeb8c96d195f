"""The colour palette of segmentation masks, shared by TensorBoard panels, and the palette PNG writer of
exported, predicted and demo masks."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def color_palette() -> np.ndarray:
    """Pascal VOC's 256-colour palette [256, 3] uint8 (class 0 black, 1 dark red, 2 dark green, ...).

    Written out rather than read from a file: it is the bit-interleaving rule every VOC tool uses.
    """
    palette = np.zeros((256, 3), dtype=np.uint8)
    for label in range(256):
        c, r, g, b = label, 0, 0, 0
        for shift in range(7, -1, -1):
            r |= ((c >> 0) & 1) << shift
            g |= ((c >> 1) & 1) << shift
            b |= ((c >> 2) & 1) << shift
            c >>= 3
        palette[label] = (r, g, b)
    return palette


def save_mask_png(path: Path, mask: np.ndarray) -> None:
    """Save a [H, W] array of class indices (0-255) as a palette PNG."""
    mask = np.ascontiguousarray(mask, dtype=np.uint8)
    image = Image.frombytes("P", (mask.shape[1], mask.shape[0]), mask.tobytes())
    image.putpalette(color_palette().flatten().tolist())
    image.save(path)
