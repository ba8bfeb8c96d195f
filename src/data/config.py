"""DataConfig: the `data` group of the Hydra config, with validation that names the key and the fix."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, List, Optional

from src.data.shapes import MAX_CLASSES
from src.dataclass_config import to_dataclass

CLASSIFICATION_DATASETS = ("shapes", "cifar10", "cifar100", "imagefolder")
SEGMENTATION_DATASETS = ("shapes_seg", "voc", "cityscapes")
DATASETS = CLASSIFICATION_DATASETS + SEGMENTATION_DATASETS


def dataset_task(name: str) -> str:
    """"classification" or "segmentation": the task of dataset `name` (ValueError for an unknown name)."""
    if name not in DATASETS:
        raise ValueError(f"data.name must be one of {', '.join(DATASETS)}, got {name!r}")
    return "segmentation" if name in SEGMENTATION_DATASETS else "classification"

# Datasets whose class count is fixed by the dataset itself.
FIXED_NUM_CLASSES = {"cifar10": 10, "cifar100": 100, "voc": 21, "cityscapes": 19}
# Datasets torchvision can download (Cityscapes needs a login, ImageNet a licence).
DOWNLOADABLE = ("cifar10", "cifar100", "voc")


@dataclass
class DataConfig:
    """Everything the data builders read; conf/data/<name>.yaml sets the fields its dataset uses."""

    name: str = "shapes"
    root: str = "data"  # folder of datasets on disk; relative paths are relative to the launch directory
    download: bool = False  # let torchvision download (local rank 0 of each node, the others wait)

    batch_size: int = 64  # per-process micro-batch; the global batch is world_size * batch_size
    eval_batch_size: int = 256  # per process; segmentation with variable image sizes always uses 1
    num_workers: int = 0
    pin_memory: bool = True  # only takes effect when CUDA is available
    persistent_workers: bool = False
    prefetch_factor: int = 2  # only with num_workers > 0

    # Embedded shapes datasets (no files): contents are fixed by generator_seed, not by the run's seed,
    # so runs with different seeds are evaluated on the same validation images.
    train_size: int = 10000
    val_size: int = 2000
    image_size: int = 32  # shapes: side of the generated images; imagefolder: train/eval crop size
    # Classes the model predicts. shapes: shape kinds; shapes_seg: background + kinds;
    # other datasets: derived (null), and a given value must match the dataset.
    num_classes: Optional[int] = None
    generator_seed: int = 0
    noise_std: float = 10.0  # shapes: std of the Gaussian pixel noise, in 0..255 units
    min_shapes: int = 2  # shapes_seg: shapes per image, drawn in [min_shapes, max_shapes]
    max_shapes: int = 4
    min_shape_size: float = 0.2  # shapes_seg: shape radius range, as a fraction of the image's shorter side
    max_shape_size: float = 0.34
    variable_val_size: bool = False  # shapes_seg: validation images of varying sizes (0.75..1.25 x image_size)
    cache: bool = True  # shapes: keep generated uint8 images in memory (per process and per loader worker)

    # Classification augmentation.
    augment: bool = True  # master switch for training augmentation
    random_crop: bool = True  # CIFAR/shapes: RandomCrop(image_size, padding=crop_padding); ImageNet: RandomResizedCrop
    crop_padding: int = 4
    hflip: bool = True
    resize_size: int = 256  # imagefolder eval: Resize(resize_size) then CenterCrop(image_size)
    color_jitter: float = 0.0  # brightness/contrast/saturation strength (0 = off)

    # Segmentation augmentation / evaluation.
    base_size: int = 0  # random scale acts on the shorter side: [scale_min, scale_max] x base_size (0 = crop_size)
    crop_size: int = 64  # training crop (padded with 0 / ignore 255 when the scaled image is smaller)
    scale_min: float = 0.5
    scale_max: float = 2.0

    # Normalisation (per channel, on images scaled to [0, 1]).
    mean: List[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])
    std: List[float] = field(default_factory=lambda: [0.25, 0.25, 0.25])

    # Dataset-specific: ImageFolder sub-folders, Cityscapes annotation mode.
    train_split: str = "train"
    val_split: str = "val"

    def validate(self) -> None:
        """Raise ValueError naming the first bad key and how to fix it."""
        if self.name not in DATASETS:
            raise ValueError(f"data.name must be one of {', '.join(DATASETS)}, got {self.name!r} "
                             "(pick a file from conf/data/, e.g. data=shapes)")
        for key in ("batch_size", "eval_batch_size", "train_size", "val_size", "prefetch_factor"):
            _at_least(key, getattr(self, key), 1)
        for key in ("num_workers", "crop_padding", "base_size", "generator_seed"):
            _at_least(key, getattr(self, key), 0)
        _at_least("image_size", self.image_size, 8)
        _at_least("crop_size", self.crop_size, 8)
        if self.name == "imagefolder":  # evaluation resizes, then centre-crops image_size
            _at_least("resize_size", self.resize_size, self.image_size)
        if self.noise_std < 0:
            raise ValueError(f"data.noise_std must be >= 0, got {self.noise_std}")
        if not 0 <= self.color_jitter <= 1:
            raise ValueError(f"data.color_jitter must be in [0, 1], got {self.color_jitter}")
        if not 0 < self.scale_min <= self.scale_max:
            raise ValueError(f"data.scale_min and data.scale_max must satisfy 0 < scale_min <= scale_max, "
                             f"got {self.scale_min} and {self.scale_max}")
        if len(self.mean) != 3 or len(self.std) != 3:
            raise ValueError(f"data.mean and data.std need 3 values (RGB), got {list(self.mean)} and {list(self.std)}")
        if any(s <= 0 for s in self.std):
            raise ValueError(f"data.std values must be > 0, got {list(self.std)}")
        if not 1 <= self.min_shapes <= self.max_shapes:
            raise ValueError(f"data.min_shapes and data.max_shapes must satisfy 1 <= min_shapes <= max_shapes, "
                             f"got {self.min_shapes} and {self.max_shapes}")
        if not 0.02 <= self.min_shape_size <= self.max_shape_size <= 0.5:
            raise ValueError(f"data.min_shape_size and data.max_shape_size must satisfy "
                             f"0.02 <= min_shape_size <= max_shape_size <= 0.5, got {self.min_shape_size} "
                             f"and {self.max_shape_size}")
        self._validate_num_classes()
        if self.download and self.name not in DOWNLOADABLE:
            raise ValueError(f"data.download=true is not possible for data.name={self.name}: "
                             f"only {', '.join(DOWNLOADABLE)} can be downloaded; put the files under data.root "
                             "(see docs/data.md) and set data.download=false")

    def _validate_num_classes(self) -> None:
        n = self.num_classes
        if self.name == "shapes":
            if n is not None and not 2 <= n <= MAX_CLASSES:
                raise ValueError(f"data.num_classes for shapes must be in 2..{MAX_CLASSES} "
                                 f"(the number of shape kinds), got {n}")
        elif self.name == "shapes_seg":
            if n is not None and not 3 <= n <= MAX_CLASSES + 1:
                raise ValueError(f"data.num_classes for shapes_seg must be in 3..{MAX_CLASSES + 1} "
                                 f"(background + 2..{MAX_CLASSES} shape kinds), got {n}")
        elif self.name in FIXED_NUM_CLASSES:
            fixed = FIXED_NUM_CLASSES[self.name]
            if n is not None and n != fixed:
                raise ValueError(f"data.num_classes={n} does not match {self.name}, which has {fixed} classes; "
                                 "remove the override (it is derived)")
        elif n is not None and n < 2:
            raise ValueError(f"data.num_classes must be >= 2 or null (derived from the folders), got {n}")

    def as_dict(self) -> dict[str, Any]:
        """Plain dict of the fields (for logs and checkpoints)."""
        return dataclasses.asdict(self)


def _at_least(key: str, value: int, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"data.{key} must be an integer >= {low}, got {value!r}")


def coerce(cfg: Any) -> DataConfig:
    """A DataConfig from a DataConfig, an OmegaConf node or a mapping (extra keys are an error)."""
    return to_dataclass(cfg, DataConfig, "data")
