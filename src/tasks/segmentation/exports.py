"""evaluate.py's export=DIR for segmentation, and how masks reach rank 0 (docs/evaluation.md).

One palette PNG per image, `{index:06d}.png`, the same size as the image; pixel values are the predicted
class indices (np.array(PIL.Image.open(path)) gives them back) and the palette is Pascal VOC's, so the files
also look right in an image viewer.
"""
from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch

from src import comm
from src.data.segmentation.palette import save_mask_png

# Masks travel to rank 0 in rounds of at most this many per rank, so no rank ever holds every rank's masks
# at once (VOC val is ~270 MB of uint8 masks, a 12-megapixel photo's mask 12 MB).
MASKS_PER_ROUND = 8


def mask_filename(index: int) -> str:
    """File name of dataset sample `index`'s exported mask."""
    return f"{index:06d}.png"


def export_segmentation(out_dir: Path, masks: list[tuple[int, torch.Tensor]]) -> None:
    """Gather every rank's (index, uint8 mask) pairs and write one PNG per image from rank 0.

    Collective: every rank must call it (with its own, possibly empty, list), after its loop.
    """
    if comm.is_main_process():
        out_dir.mkdir(parents=True, exist_ok=True)
    gather_masks(((i, m.numpy()) for i, m in masks), len(masks),
                 lambda index, mask: save_mask_png(out_dir / mask_filename(index), mask))
    comm.barrier()  # every rank returns once the files exist


def gather_masks(masks: Iterable[tuple[int, np.ndarray]], local_count: int,
                 write: Callable[[int, np.ndarray], None]) -> list[int]:
    """Send this rank's `local_count` (index, mask) pairs to rank 0, which calls `write` on each, in rounds.

    `masks` may be a generator that computes them: each round takes at most MASKS_PER_ROUND from it, so no
    rank holds more than a round of masks. Collective: every rank joins every round, maybe with none.
    Returns the indices of every rank's masks, on every rank (for the exactly-once check).
    """
    counts = comm.all_gather_object(local_count)
    source = iter(masks)
    seen: list[int] = []
    for _ in range(math.ceil(max(counts) / MASKS_PER_ROUND)):
        chunk = list(itertools.islice(source, MASKS_PER_ROUND))
        for part in comm.all_gather_object(chunk):
            for index, mask in part:
                seen.append(index)
                if comm.is_main_process():
                    write(index, mask)
    return seen
