"""Classification datasets: embedded shapes, CIFAR-10/100 (torchvision), ImageNet-style ImageFolder."""
from __future__ import annotations

from torch.utils.data import Dataset
from torchvision import datasets

from src.data import shapes
from src.data.config import DataConfig
from src.data.download import guarded, missing_download_message, require_dir, resolve_root
from src.data.shapes_datasets import ShapesClassification

# (train dataset, val dataset, class names); transforms are applied by the caller.
Splits = tuple[Dataset, Dataset, list[str]]


def build_shapes(cfg: DataConfig) -> Splits:
    """The embedded classification set: one dominant shape per image, label = its kind."""
    k = cfg.num_classes or shapes.DEFAULT_CLASSIFICATION_KINDS
    common = dict(image_size=cfg.image_size, num_classes=k, noise_std=cfg.noise_std, cache=cfg.cache)
    train = ShapesClassification(cfg.generator_seed, "train", cfg.train_size, **common)
    val = ShapesClassification(cfg.generator_seed, "val", cfg.val_size, **common)
    return train, val, list(train.classes)


def build_cifar(cfg: DataConfig) -> Splits:
    """CIFAR-10/100 from torchvision: downloaded under data.root on local rank 0 first when data.download."""
    cls = datasets.CIFAR10 if cfg.name == "cifar10" else datasets.CIFAR100
    root = resolve_root(cfg.root)
    folder = root / cls.base_folder
    files = [name for name, _ in cls.train_list + cls.test_list] + [cls.meta["filename"]]

    def build() -> tuple[Dataset, Dataset]:
        missing = [f for f in files if not (folder / f).is_file()]
        if missing and not cfg.download:
            raise FileNotFoundError(
                missing_download_message(cfg.name, folder, downloadable=True)
                + f" (missing: {', '.join(missing)}; torchvision expects the python version of the batches)")
        try:
            train = cls(str(root), train=True, download=cfg.download)
            val = cls(str(root), train=False, download=False)
        except RuntimeError as exc:  # torchvision's MD5 check failed
            raise RuntimeError(f"{cfg.name} files under {folder.resolve()} failed torchvision's checksum check "
                               f"({exc}); delete the folder and set data.download=true, or restore the files") from exc
        return train, val

    train, val = guarded(build)
    return train, val, list(train.classes)


def build_imagefolder(cfg: DataConfig) -> Splits:
    """ImageNet-style folders: <root>/<train_split>/<class>/*.jpg and <root>/<val_split>/<class>/*.jpg."""
    root = resolve_root(cfg.root)
    how = "one sub-folder per class holding its images, e.g. <root>/train/n01440764/*.JPEG; set data.root"
    train_dir, val_dir = root / cfg.train_split, root / cfg.val_split
    require_dir(train_dir, "ImageFolder training split", how)
    require_dir(val_dir, "ImageFolder validation split", how)
    train = datasets.ImageFolder(str(train_dir))
    val = datasets.ImageFolder(str(val_dir))
    if val.classes != train.classes:
        only_train = sorted(set(train.classes) - set(val.classes))
        only_val = sorted(set(val.classes) - set(train.classes))
        raise ValueError(f"the class folders of {train_dir} and {val_dir} differ (only in train: {only_train[:5]}, "
                         f"only in val: {only_val[:5]}); both splits need the same class sub-folders")
    if cfg.num_classes is not None and cfg.num_classes != len(train.classes):
        raise ValueError(f"data.num_classes={cfg.num_classes} but {train_dir} has {len(train.classes)} class "
                         "folders; remove the override (it is derived) or fix the folders")
    return train, val, list(train.classes)


def build_classification(cfg: DataConfig) -> Splits:
    """Dispatch on data.name."""
    if cfg.name == "shapes":
        return build_shapes(cfg)
    if cfg.name in ("cifar10", "cifar100"):
        return build_cifar(cfg)
    if cfg.name == "imagefolder":
        return build_imagefolder(cfg)
    raise ValueError(f"data.name={cfg.name} is not a classification dataset")

