"""Cityscapes fine annotations (`data=cityscapes`) from torchvision; no download (it needs a login)."""
from __future__ import annotations

import torch
from torchvision import datasets

from src.data.config import DataConfig
from src.data.download import require_dir, resolve_root
from src.data.registry import DATASETS, Splits
from src.data.segmentation.masks import IGNORE_INDEX, TensorPairs

NUM_TRAIN_IDS = 19


def cityscapes_lut() -> tuple[torch.Tensor, list[str]]:
    """Lookup table labelId -> train id (19 classes, 255 = ignore) and the 19 class names in train-id order."""
    lut = torch.full((256,), IGNORE_INDEX, dtype=torch.uint8)
    names = [""] * NUM_TRAIN_IDS
    for c in datasets.Cityscapes.classes:
        if 0 <= c.train_id < NUM_TRAIN_IDS and c.id >= 0:
            lut[c.id] = c.train_id
            names[c.train_id] = c.name
    return lut, names


@DATASETS.register("cityscapes", task="segmentation", num_classes=NUM_TRAIN_IDS, varying_sizes=True)
def build_cityscapes(cfg: DataConfig) -> Splits:
    """<root>/leftImg8bit/<split>/<city>/ and <root>/gtFine/<split>/<city>/; labelIds mapped to the 19 train ids."""
    root = resolve_root(cfg.root)
    how = ("download leftImg8bit_trainvaltest.zip and gtFine_trainvaltest.zip from cityscapes-dataset.com "
           f"and extract both into {root.resolve()}, giving <root>/leftImg8bit/<split>/<city>/*_leftImg8bit.png "
           "and <root>/gtFine/<split>/<city>/*_gtFine_labelIds.png")
    for split in (cfg.train_split, cfg.val_split):
        require_dir(root / "leftImg8bit" / split, f"Cityscapes images ({split})", how)
        require_dir(root / "gtFine" / split, f"Cityscapes fine annotations ({split})", how)
    lut, names = cityscapes_lut()
    kwargs = dict(mode="fine", target_type="semantic")
    train = datasets.Cityscapes(str(root), split=cfg.train_split, **kwargs)
    val = datasets.Cityscapes(str(root), split=cfg.val_split, **kwargs)
    # All Cityscapes images are 1024x2048, but a custom subset might not be: evaluate one image per batch.
    return Splits(_pairs(train, lut), _pairs(val, lut), names, val_same_size=False)


def _pairs(split: datasets.Cityscapes, lut: torch.Tensor) -> TensorPairs:
    """Each image with its labelIds map (target_type="semantic": one target file per image)."""
    return TensorPairs(split.images, [targets[0] for targets in split.targets], lut)
