"""DataConfig: the `data` group of the Hydra config, with validation that names the key and the fix.

DataConfig holds the keys every dataset and task reads; a dataset's own keys (data.mask_suffix, the several-shapes
sets' data.min_shapes, ...) are declared where it is registered (`DATASETS.register(..., options=...)`) and a
task's (data.crop_size, data.auto_augment, ...) in its options (src/tasks/<task>/options.py); data_schema() and
src/config/schema.py add them to the schema.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, List, Optional

from src.data.registry import DATASETS, dataset_entry
from src.dataclass_config import Owned, extend, section, to_dataclass


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
    # Classes the model predicts. shapes: shape kinds; the several-shapes sets: background + kinds;
    # other datasets: derived (null), and a given value must match the dataset.
    num_classes: Optional[int] = None
    generator_seed: int = 0
    noise_std: float = 10.0  # shapes: std of the Gaussian pixel noise, in 0..255 units
    # shapes: per-image contrast gain and brightness/colour offsets (0 = off, 1 = strong), so that the
    # statistics of a small batch differ from the set's (src/data/datasets/shapes/drawing.py,
    # scripts/syncbn_benefit.py).
    photometric_spread: float = 0.0
    cache: bool = True  # shapes: keep generated uint8 images in memory (per process and per loader worker)

    # Training augmentation every task has (a task's own keys, e.g. data.crop_size, are its options).
    augment: bool = True  # master switch for training augmentation
    hflip: bool = True
    color_jitter: float = 0.0  # brightness/contrast/saturation strength (0 = off)

    # Normalisation (per channel, on images scaled to [0, 1]).
    mean: List[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])
    std: List[float] = field(default_factory=lambda: [0.25, 0.25, 0.25])

    # Sub-folders (imagefolder, segfolder), image sets (VOC), splits (Cityscapes) or COCO-format image folders
    # with annotations/instances_<split>.json (coco) to train and validate on.
    train_split: str = "train"
    val_split: str = "val"

    def validate(self) -> None:
        """Raise ValueError naming the first bad key and how to fix it (on a data_schema() instance, the
        dataset's own options too; the task's: Task.validate)."""
        entry = dataset_entry(self.name)  # ValueError listing every registered data.name
        for key in ("batch_size", "eval_batch_size", "train_size", "val_size", "prefetch_factor"):
            _at_least(key, getattr(self, key), 1)
        for key in ("num_workers", "generator_seed"):
            _at_least(key, getattr(self, key), 0)
        if not (isinstance(self.device_transforms, bool) or self.device_transforms == "auto"):
            raise ValueError(f"data.device_transforms must be true, false or auto (on when training on CUDA), "
                             f"got {self.device_transforms!r}")
        _check_decode_on_device(self, entry.info.get("encoded_files", False))
        _at_least("image_size", self.image_size, 8)
        if self.noise_std < 0:
            raise ValueError(f"data.noise_std must be >= 0, got {self.noise_std}")
        if not 0 <= self.photometric_spread <= 1:
            raise ValueError(f"data.photometric_spread must be in [0, 1], got {self.photometric_spread}")
        if not 0 <= self.color_jitter <= 1:
            raise ValueError(f"data.color_jitter must be in [0, 1], got {self.color_jitter}")
        if len(self.mean) != 3 or len(self.std) != 3:
            raise ValueError(f"data.mean and data.std need 3 values (RGB), got {list(self.mean)} and {list(self.std)}")
        if any(s <= 0 for s in self.std):
            raise ValueError(f"data.std values must be > 0, got {list(self.std)}")
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
        _check_dataset_options(self, entry)
        check = entry.info.get("check")
        if check is not None:
            check(self)


def dataset_options() -> list[Owned]:
    """("data=<name>", its option dataclass) of every registered dataset that declares options."""
    return [(f"data={e.name}", e.info["options"]) for e in DATASETS if e.info.get("options") is not None]


def data_schema() -> type[DataConfig]:
    """The `data` group's schema in the data layer: DataConfig with every registered dataset's options (the
    run's full schema adds the tasks' own: src/config/schema.py)."""
    return _schema(tuple(dataset_options()))


@functools.lru_cache(maxsize=None)
def _schema(parts: tuple[Owned, ...]) -> type[DataConfig]:
    return extend(DataConfig, parts)


def _check_dataset_options(cfg: DataConfig, entry: Any) -> None:
    """The dataset checks its own options. Another dataset's are left unread, not refused: a recipe sets them for
    its dataset (conf/experiment/*.yaml), and `data=` on the command line must still swap the dataset."""
    own = entry.info.get("options")
    if own is not None and all(hasattr(cfg, f.name) for f in dataclasses.fields(own)):
        options = section(cfg, own)
        if hasattr(options, "validate"):
            options.validate()


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
    """A DataConfig (data_schema()'s) from a DataConfig, an OmegaConf node or a mapping (extra keys are an error)."""
    return to_dataclass(cfg, data_schema(), "data")


def checked(cfg: Any) -> DataConfig:
    """A DataConfig ready to build from: a data_schema() instance as it is (config validation checked it, once);
    a DataConfig of the core keys alone (the datasets' options at their defaults), a mapping or an OmegaConf
    node coerced and validated here."""
    if isinstance(cfg, data_schema()):
        return cfg
    if isinstance(cfg, DataConfig):
        cfg = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(DataConfig)}
    data = coerce(cfg)
    data.validate()
    return data
