"""DataConfig: the `data` group of the Hydra config, with validation that names the key and the fix."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from src.data.registry import DATASETS, dataset_entry
from src.dataclass_config import to_dataclass


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
    # Training batches leave the workers as uint8 and are normalised (and randomly erased) on the device,
    # after a pinned, non-blocking copy prefetched one batch ahead: true | false | auto (on when training on
    # CUDA). Evaluation loaders always normalise in the workers. See src/data/device_transforms.py.
    device_transforms: Any = "auto"
    # JPEG image folders (imagefolder): the workers only read the files; the device decodes each training
    # batch (torchvision.io.decode_jpeg) and runs the training augmentation there, with each sample's seed.
    # Needs device_transforms on. See src/data/device_decode.py.
    decode_on_device: bool = False

    # Embedded shapes datasets (no files): contents are fixed by generator_seed, not by the run's seed,
    # so runs with different seeds are evaluated on the same validation images.
    train_size: int = 10000
    val_size: int = 2000
    image_size: int = 32  # shapes: side of the generated images; imagefolder: train/eval crop size
    # Classes the model predicts. shapes: shape kinds; shapes_seg, shapes_det: background + kinds;
    # other datasets: derived (null), and a given value must match the dataset.
    num_classes: Optional[int] = None
    generator_seed: int = 0
    noise_std: float = 10.0  # shapes: std of the Gaussian pixel noise, in 0..255 units
    # shapes: per-image contrast gain and brightness/colour offsets (0 = off, 1 = strong), so that the
    # statistics of a small batch differ from the set's (src/data/shapes.py, scripts/syncbn_benefit.py).
    photometric_spread: float = 0.0
    min_shapes: int = 2  # shapes_seg, shapes_det: shapes per image, drawn in [min_shapes, max_shapes]
    max_shapes: int = 4
    min_shape_size: float = 0.2  # shapes_seg, shapes_det: shape radius range, as a fraction of the image's shorter side
    max_shape_size: float = 0.34
    # shapes_seg, shapes_det: validation images of varying sizes (0.75..1.25 x image_size)
    variable_val_size: bool = False
    cache: bool = True  # shapes: keep generated uint8 images in memory (per process and per loader worker)

    # Classification augmentation.
    augment: bool = True  # master switch for training augmentation
    random_crop: bool = True  # CIFAR/shapes: RandomCrop(image_size, padding=crop_padding); ImageNet: RandomResizedCrop
    crop_padding: int = 4
    hflip: bool = True
    resize_size: int = 256  # imagefolder eval: Resize(resize_size) then CenterCrop(image_size)
    color_jitter: float = 0.0  # brightness/contrast/saturation strength (0 = off)
    # Automatic augmentation policy after crop / flip / jitter (torchvision.transforms.v2, default settings):
    # randaugment | trivialaugment | autoaugment (the ImageNet policy) | none. Classification only.
    auto_augment: str = "none"
    # Probability of v2.RandomErasing on the normalised image (0 = off; timm's --reprob, torchvision's
    # references' --random-erase, both use 0.25). Classification only.
    random_erase: float = 0.0

    # Segmentation augmentation / evaluation.
    base_size: int = 0  # random scale acts on the shorter side: [scale_min, scale_max] x base_size (0 = crop_size)
    crop_size: int = 64  # training crop (padded with 0 / ignore 255 when the scaled image is smaller)
    scale_min: float = 0.5
    scale_max: float = 2.0

    # Normalisation (per channel, on images scaled to [0, 1]).
    mean: List[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])
    std: List[float] = field(default_factory=lambda: [0.25, 0.25, 0.25])

    # Sub-folders (imagefolder, segfolder), image sets (VOC), splits (Cityscapes) or COCO-format image folders
    # with annotations/instances_<split>.json (coco) to train and validate on.
    train_split: str = "train"
    val_split: str = "val"
    # segfolder: masks/<image path without extension><mask_suffix>.png, e.g. "_mask" for a_mask.png.
    mask_suffix: str = ""
    # segfolder: one class name per line (line k names mask value k); relative paths are relative to
    # data.root; null = <root>/classes.txt when present, else classes numbered 0..num_classes-1.
    classes_file: Optional[str] = None

    def validate(self) -> None:
        """Raise ValueError naming the first bad key and how to fix it."""
        entry = dataset_entry(self.name)  # ValueError listing every registered data.name
        for key in ("batch_size", "eval_batch_size", "train_size", "val_size", "prefetch_factor"):
            _at_least(key, getattr(self, key), 1)
        for key in ("num_workers", "crop_padding", "base_size", "generator_seed"):
            _at_least(key, getattr(self, key), 0)
        if not (isinstance(self.device_transforms, bool) or self.device_transforms == "auto"):
            raise ValueError(f"data.device_transforms must be true, false or auto (on when training on CUDA), "
                             f"got {self.device_transforms!r}")
        _check_decode_on_device(self, entry.info.get("encoded_files", False))
        _at_least("image_size", self.image_size, 8)
        _at_least("crop_size", self.crop_size, 8)
        if self.noise_std < 0:
            raise ValueError(f"data.noise_std must be >= 0, got {self.noise_std}")
        if not 0 <= self.photometric_spread <= 1:
            raise ValueError(f"data.photometric_spread must be in [0, 1], got {self.photometric_spread}")
        if not 0 <= self.color_jitter <= 1:
            raise ValueError(f"data.color_jitter must be in [0, 1], got {self.color_jitter}")
        _check_image_only_augmentation(self)
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
        fixed, n = entry.info.get("num_classes"), self.num_classes
        if fixed is not None and n is not None and n != fixed:
            raise ValueError(f"data.num_classes={n} does not match {self.name}, which has {fixed} classes; "
                             "remove the override (it is derived)")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 2):
            raise ValueError(f"data.num_classes must be an integer >= 2 or null (derived from the dataset), got {n!r}")
        if self.download and not entry.info.get("download"):
            downloadable = [e.name for e in DATASETS if e.info.get("download")]
            raise ValueError(f"data.download=true is not possible for data.name={self.name}: "
                             f"only {', '.join(downloadable)} can be downloaded; put the files under data.root "
                             "(see docs/data.md) and set data.download=false")
        check = entry.info.get("check")
        if check is not None:
            check(self)


AUTO_AUGMENT_POLICIES = ("none", "randaugment", "trivialaugment", "autoaugment")


def _check_image_only_augmentation(cfg: DataConfig) -> None:
    """data.auto_augment / data.random_erase: known values, under data.augment (which tasks they apply to is the
    tasks' to say)."""
    if cfg.auto_augment not in AUTO_AUGMENT_POLICIES:
        raise ValueError(f"data.auto_augment must be one of {', '.join(AUTO_AUGMENT_POLICIES)}, "
                         f"got {cfg.auto_augment!r}")
    erase = cfg.random_erase
    if isinstance(erase, bool) or not isinstance(erase, (int, float)) or not 0 <= erase <= 1:
        raise ValueError(f"data.random_erase is a probability in [0, 1] (0 = off), got {erase!r}")
    used = [k for k, on in (("auto_augment", cfg.auto_augment != "none"), ("random_erase", erase > 0)) if on]
    if used and not cfg.augment:
        raise ValueError(f"data.{used[0]} is training augmentation, which data.augment=false turns off: "
                         f"set data.augment=true or remove data.{used[0]}")


def _check_decode_on_device(cfg: DataConfig, encoded_files: bool) -> None:
    """data.decode_on_device: a bool, with device_transforms not off, for datasets of JPEG files only."""
    if not isinstance(cfg.decode_on_device, bool):
        raise ValueError(f"data.decode_on_device must be true or false, got {cfg.decode_on_device!r}")
    if not cfg.decode_on_device:
        return
    if cfg.device_transforms is False:
        raise ValueError("data.decode_on_device=true needs data.device_transforms=true (or auto, on CUDA): the "
                         "images decoded on the device are normalised there; set data.device_transforms=true "
                         "or data.decode_on_device=false")
    if not encoded_files:
        offer = [e.name for e in DATASETS if e.info.get("encoded_files")]
        raise ValueError(f"data.decode_on_device applies to folders of JPEG files ({', '.join(offer)}), not to "
                         f"data.name={cfg.name}: set data.decode_on_device=false")


def _at_least(key: str, value: int, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"data.{key} must be an integer >= {low}, got {value!r}")


def coerce(cfg: Any) -> DataConfig:
    """A DataConfig from a DataConfig, an OmegaConf node or a mapping (extra keys are an error)."""
    return to_dataclass(cfg, DataConfig, "data")


def checked(cfg: Any) -> DataConfig:
    """A DataConfig ready to build from: an instance as it is (config validation checked it, once), a mapping or
    an OmegaConf node coerced and validated here."""
    if isinstance(cfg, DataConfig):
        return cfg
    data = coerce(cfg)
    data.validate()
    return data
