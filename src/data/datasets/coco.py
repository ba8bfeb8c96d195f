"""Detection and instance-segmentation data in COCO format (`data=coco`): COCO 2017 itself, or your own images
with a COCO json.

    <data.root>/
        <data.train_split>/...                          images; each "file_name" is relative to this folder
        <data.val_split>/...
        annotations/instances_<data.train_split>.json
        annotations/instances_<data.val_split>.json

conf/data/coco.yaml names the splits train2017 and val2017 (COCO 2017 as extracted). Everything is checked
when the dataset is built, before training (src/data/coco_annotations.py: each error names the file and the
entry); crowd annotations and boxes without area are dropped from the training targets, category ids become
labels 1..K in id order. The validation targets also carry each image's ground truth as the file has it
(target["coco"], a CocoImageTruth: crowd regions, every box, the annotations' area, the file's ids), which
COCO's evaluation reads (src/evaluation/coco.py). Loading goes through torchvision's CocoDetection
(pycocotools' index) and its transforms-v2 wrapper, which turns the [x, y, w, h] boxes into XYXY BoundingBoxes
and, for instance segmentation, each annotation's polygons or run-length encoding into a mask.
"""
from __future__ import annotations

import contextlib
import io
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision import datasets, tv_tensors
from torchvision.datasets.vision import VisionDataset

from src.data.coco_annotations import COCO_TRUTH_KEY, CocoAnnotations, CocoImageTruth, image_truths, load_annotations
from src.data.config import DataConfig
from src.data.download import require_dir, resolve_root
from src.data.image_files import load_rgb
from src.data.registry import DATASETS, Splits
from src.data.task_data import TaskData
from src.data.transforms import to_image
from src.errors import MissingFileError

log = logging.getLogger(__name__)

ANNOTATIONS_DIR = "annotations"
LAYOUT = ("coco expects <root>/<split>/ with the images and <root>/annotations/instances_<split>.json, the split "
          "names from data.train_split and data.val_split (docs/detection.md); set data.root")


def annotation_path(root: Path, split: str) -> Path:
    """Where a split's annotation file must be: <root>/annotations/instances_<split>.json."""
    return root / ANNOTATIONS_DIR / f"instances_{split}.json"


class _IndexedCoco(datasets.CocoDetection):
    """CocoDetection over an index built from an already checked and cleaned dict, so the file is parsed once."""

    def __init__(self, images_dir: Path, coco: Any) -> None:
        VisionDataset.__init__(self, str(images_dir))
        self.coco = coco
        self.ids = sorted(coco.imgs.keys())  # what CocoDetection.__init__ sets

    def _load_image(self, id: int) -> Image.Image:
        """CocoDetection's, with an error that names a file it cannot decode (PIL's names none)."""
        return load_rgb(Path(self.root) / self.coco.loadImgs(id)[0]["file_name"])


class CocoDetectionSet(Dataset):
    """(tv_tensors.Image uint8 [3, H, W], {"boxes": BoundingBoxes XYXY float32 [K, 4], "labels": int64 [K]}),
    with `masks` also "masks": tv_tensors.Mask uint8 [K, H, W] (annotations read with masks=True).

    Samples are in increasing image id order (`image_ids[i]` is sample i's); boxes are clamped to the image
    and those left without area dropped (with their masks). `coco` is the pycocotools index of the cleaned
    annotations (category ids = labels). With `evaluation`, each target also holds the image's CocoImageTruth
    under "coco".
    """

    def __init__(self, images_dir: Path, annotations: CocoAnnotations, evaluation: bool = False,
                 masks: bool = False) -> None:
        # Imported here, as torchvision does, so that the other datasets work without pycocotools.
        from pycocotools.coco import COCO

        coco = COCO()
        coco.dataset = annotations.data
        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints "creating index..."
            coco.createIndex()
        self.coco = coco
        base = _IndexedCoco(images_dir, coco)
        self.image_ids: list[int] = list(base.ids)
        self.masks = masks
        keys = {"boxes", "labels", "masks"} if masks else {"boxes", "labels"}
        self._samples = datasets.wrap_dataset_for_transforms_v2(base, target_keys=keys)
        self.truths = image_truths(annotations) if evaluation else None
        self.classes = ["background"] + [name for _, name in annotations.categories]  # label k's name (pictures)

    def __len__(self) -> int:
        return len(self.image_ids)

    def __getitem__(self, index: int) -> tuple[tv_tensors.Image, dict[str, torch.Tensor]]:
        image, target = self._samples[index]
        image = to_image(image)
        h, w = image.shape[-2:]
        if "boxes" in target:  # the wrapper gives no boxes for an image without annotations
            boxes = target["boxes"].as_subclass(torch.Tensor).to(torch.float32)
            boxes[:, 0::2] = boxes[:, 0::2].clamp(0, w)  # annotation tools let boxes overhang by a pixel or so
            boxes[:, 1::2] = boxes[:, 1::2].clamp(0, h)
            labels = target["labels"].to(torch.int64)
            keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
            boxes, labels = boxes[keep], labels[keep]
            masks = target["masks"][keep] if self.masks else None
        else:
            boxes, labels = torch.zeros(0, 4), torch.zeros(0, dtype=torch.int64)
            masks = torch.zeros(0, h, w, dtype=torch.uint8) if self.masks else None
        target = {"boxes": tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=(h, w)), "labels": labels}
        if masks is not None:
            if masks.shape[-2:] != (h, w):  # a run-length encoding of another size, in a file without image sizes
                raise ValueError(f"coco image id {self.image_ids[index]}: its masks are {tuple(masks.shape[-2:])} "
                                 f"(height, width) but the image is {(h, w)}: each run-length 'segmentation' must "
                                 "have its image's size")
            target["masks"] = tv_tensors.Mask(masks.as_subclass(torch.Tensor).to(torch.uint8))
        if self.truths is not None:
            target[COCO_TRUTH_KEY] = self._truth(self.image_ids[index], w, h)
        return image, target

    def _truth(self, image_id: int, width: int, height: int) -> CocoImageTruth:
        """The image's ground truth as the file has it, its size filled in from the image where the file gives none."""
        truth = self.truths[image_id]  # type: ignore[index]
        if "width" in truth.image and "height" in truth.image:
            return truth
        return replace(truth, image={"width": width, "height": height, **truth.image})


@DATASETS.register("coco", task=("detection", "instance_segmentation"), varying_sizes=True)
def build_coco(cfg: DataConfig, handling: Optional[TaskData] = None) -> Splits:
    """Both splits checked (src/data/coco_annotations.py); the validation split must have the training categories.
    For a task whose targets have "masks" (`handling.target_keys`: instance segmentation), every annotation's mask
    is read too: the files must have them."""
    masks = handling is not None and "masks" in handling.target_keys
    root = resolve_root(cfg.root)
    loaded: dict[str, tuple[Path, CocoAnnotations]] = {}
    for split in (cfg.train_split, cfg.val_split):
        images_dir, ann_file = root / split, annotation_path(root, split)
        require_dir(images_dir, f"coco images of split {split!r}", LAYOUT)
        if not ann_file.is_file():
            raise MissingFileError(f"coco annotations of split {split!r} not found: expected the file "
                                   f"{ann_file.resolve()} ({LAYOUT})")
        loaded[split] = images_dir, load_annotations(ann_file, images_dir, masks=masks)
    train, val = loaded[cfg.train_split][1], loaded[cfg.val_split][1]
    if val.categories != train.categories:
        raise ValueError(f"{val.path} and {train.path} define different categories ({_describe(val.categories)} vs "
                         f"{_describe(train.categories)}): both splits must list the same ids and names, since "
                         "labels follow the category ids")
    for split, (_, ann) in loaded.items():
        log.info("coco %s: %d images, %d boxes, %d categories; dropped %d crowd and %d zero-area annotations",
                 split, len(ann.data["images"]), len(ann.data["annotations"]), len(ann.categories),
                 ann.crowd_dropped, ann.degenerate_dropped)
    names = ["background"] + [name for _, name in train.categories]
    return Splits(CocoDetectionSet(loaded[cfg.train_split][0], train, masks=masks),
                  CocoDetectionSet(loaded[cfg.val_split][0], val, evaluation=True, masks=masks), names,
                  val_same_size=False)


def _describe(categories: list[tuple[int, str]]) -> str:
    shown = ", ".join(f"{cid}: {name!r}" for cid, name in categories[:8])
    return f"{len(categories)}: {shown}{', ...' if len(categories) > 8 else ''}"
