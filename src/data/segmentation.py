"""Segmentation datasets: embedded shapes masks, Pascal VOC 2012 and Cityscapes (torchvision).

Every base dataset here returns (tv_tensors.Image uint8 [3, H, W], tv_tensors.Mask uint8 [H, W]) with
255 = ignore, so the joint transforms in seg_transforms.py treat them all alike.
"""
from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset
from torchvision import datasets, tv_tensors

from src.data import shapes
from src.data.config import DataConfig
from src.data.download import guarded, missing_download_message, require_dir, resolve_root
from src.data.seg_transforms import IGNORE_INDEX
from src.data.shapes_datasets import ShapesSegmentation
from src.data.transforms import to_image, to_mask

# (train dataset, val dataset, class names, whether val images all have one size)
SegSplits = tuple[Dataset, Dataset, list[str], bool]

VOC_CLASSES = [
    "background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
    "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor",
]


class _TensorPairs(Dataset):
    """Adapts a torchvision dataset of (PIL image, PIL label map) to (Image, Mask) tensors."""

    def __init__(self, base: Dataset, lut: torch.Tensor | None = None) -> None:
        self.base = base
        self.lut = lut

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> tuple[tv_tensors.Image, tv_tensors.Mask]:
        image, mask = self.base[index]
        return to_image(image), to_mask(mask, self.lut)

    def __getattr__(self, name: str) -> Any:  # expose e.g. .images / .targets of the torchvision dataset
        if name in ("base", "lut"):
            raise AttributeError(name)
        return getattr(self.base, name)


def build_shapes_seg(cfg: DataConfig) -> SegSplits:
    """Several shapes per image; data.num_classes counts the background (so kinds = num_classes - 1)."""
    kinds = (cfg.num_classes or shapes.DEFAULT_SEGMENTATION_KINDS + 1) - 1
    common = dict(image_size=cfg.image_size, num_shape_kinds=kinds, min_shapes=cfg.min_shapes,
                  max_shapes=cfg.max_shapes, noise_std=cfg.noise_std, cache=cfg.cache,
                  radius_range=(cfg.min_shape_size, cfg.max_shape_size))
    train = ShapesSegmentation(cfg.generator_seed, "train", cfg.train_size, **common)
    val = ShapesSegmentation(cfg.generator_seed, "val", cfg.val_size, variable_size=cfg.variable_val_size, **common)
    return train, val, list(train.classes), not cfg.variable_val_size


def build_voc(cfg: DataConfig) -> SegSplits:
    """Pascal VOC 2012 segmentation under <root>/VOCdevkit/VOC2012 (torchvision's layout)."""
    root = resolve_root(cfg.root)
    voc_root = root / "VOCdevkit" / "VOC2012"

    def build() -> tuple[Dataset, Dataset]:
        present = voc_root.is_dir()
        if not present and not cfg.download:
            raise FileNotFoundError(
                missing_download_message("Pascal VOC 2012", voc_root, downloadable=True)
                + " (JPEGImages/, SegmentationClass/, ImageSets/Segmentation/{train,val}.txt)")
        for split in (cfg.train_split, cfg.val_split):
            if present and not (voc_root / "ImageSets" / "Segmentation" / f"{split}.txt").is_file():
                raise FileNotFoundError(f"Pascal VOC split list {voc_root.resolve()}/ImageSets/Segmentation/{split}.txt "
                                        "not found; data.train_split/val_split must name one of train, val, trainval")
        # torchvision re-extracts the 2 GB archive whenever download=True, so only ask when it is absent.
        download = cfg.download and not present
        train = datasets.VOCSegmentation(str(root), year="2012", image_set=cfg.train_split, download=download)
        val = datasets.VOCSegmentation(str(root), year="2012", image_set=cfg.val_split, download=False)
        return train, val

    train, val = guarded(build)
    return _TensorPairs(train), _TensorPairs(val), list(VOC_CLASSES), False


def cityscapes_lut() -> tuple[torch.Tensor, list[str]]:
    """Lookup table labelId -> train id (19 classes, 255 = ignore) and the 19 class names in train-id order."""
    lut = torch.full((256,), IGNORE_INDEX, dtype=torch.uint8)
    names = [""] * 19
    for c in datasets.Cityscapes.classes:
        if 0 <= c.train_id < 19 and c.id >= 0:
            lut[c.id] = c.train_id
            names[c.train_id] = c.name
    return lut, names


def build_cityscapes(cfg: DataConfig) -> SegSplits:
    """Cityscapes fine annotations; no download (it needs a login), labelIds mapped to the 19 train ids."""
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
    return _TensorPairs(train, lut), _TensorPairs(val, lut), names, False


def build_segmentation(cfg: DataConfig) -> SegSplits:
    """Dispatch on data.name."""
    if cfg.name == "shapes_seg":
        return build_shapes_seg(cfg)
    if cfg.name == "voc":
        return build_voc(cfg)
    if cfg.name == "cityscapes":
        return build_cityscapes(cfg)
    raise ValueError(f"data.name={cfg.name} is not a segmentation dataset")
