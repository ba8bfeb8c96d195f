"""Classification's transforms (torchvision.transforms.v2): training augmentation, evaluation and predict.py's
input, and how its samples are batched (its TaskData)."""
from __future__ import annotations

from typing import Any, Callable

from torchvision.transforms import v2

from src.data.config import DataConfig
from src.data.device_transforms import EraseBox
from src.data.task_data import TaskData
from src.data.transforms import PairTransform, normalize, varying_sizes


def classification_train_transform(cfg: DataConfig, on_device: bool = False) -> PairTransform:
    """Training augmentation: fixed-size images pad-and-crop, images of any size RandomResizedCrop; flip.

    `on_device` (data.device_transforms): stop before normalisation, return uint8 images, and draw random
    erasing's rectangle here but leave the erasing to src/data/device_transforms.py (target: ErasedTarget).
    """
    steps: list[Any] = [v2.ToImage()]
    resize_crop = varying_sizes(cfg)
    if cfg.augment:
        if cfg.random_crop:
            if resize_crop:
                steps.append(v2.RandomResizedCrop(cfg.image_size, antialias=True))
            else:
                steps.append(v2.RandomCrop(cfg.image_size, padding=cfg.crop_padding or None))
        elif resize_crop:
            steps += _resize_center_crop(cfg.resize_size, cfg.image_size)
        if cfg.hflip:
            steps.append(v2.RandomHorizontalFlip())
        if cfg.color_jitter > 0:
            j = cfg.color_jitter
            steps.append(v2.ColorJitter(brightness=j, contrast=j, saturation=j))
        steps += auto_augment(cfg.auto_augment)
    elif resize_crop:
        steps += _resize_center_crop(cfg.resize_size, cfg.image_size)
    if not on_device:
        steps += normalize(cfg)
    if cfg.augment and cfg.random_erase > 0:
        # After normalisation, as in torchvision's references and timm: erased pixels become 0, the mean colour.
        steps.append(EraseBox(cfg.random_erase) if on_device else v2.RandomErasing(p=cfg.random_erase, value=0))
    return PairTransform(v2.Compose(steps))


def check_image_data(data: DataConfig) -> None:
    """The data keys these transforms read together, refused before any process starts: images of varying sizes
    are evaluated resized, then cropped (data.resize_size >= data.image_size); the automatic augmentation and
    erasing are training augmentation (data.augment). Every task on these transforms calls it from its validate."""
    if varying_sizes(data) and (not isinstance(data.resize_size, int) or data.resize_size < data.image_size):
        raise ValueError(f"data.resize_size must be an integer >= {data.image_size}, got {data.resize_size!r}")
    used = [k for k, on in (("auto_augment", data.auto_augment != "none"), ("random_erase", data.random_erase > 0))
            if on]
    if used and not data.augment:
        raise ValueError(f"data.{used[0]} is training augmentation, which data.augment=false turns off: "
                         f"set data.augment=true or remove data.{used[0]}")


def auto_augment(policy: str) -> list[Any]:
    """data.auto_augment as v2 transforms on the uint8 image (the policies' magnitudes assume 0..255 pixels).

    They draw from torch's global RNG like every v2 transform, so SeededTransformDataset seeds them per
    (seed, epoch, index): the same sample gets the same operations on any rank and any world size.
    """
    policies: dict[str, Callable[[], Any]] = {
        "none": lambda: None,
        "randaugment": v2.RandAugment,  # 2 operations of magnitude 9 (of 31), as torchvision's references
        "trivialaugment": v2.TrivialAugmentWide,
        "autoaugment": lambda: v2.AutoAugment(v2.AutoAugmentPolicy.IMAGENET),
    }
    if policy not in policies:
        raise ValueError(f"data.auto_augment must be one of {', '.join(policies)}, got {policy!r}")
    step = policies[policy]()
    return [] if step is None else [step]


def classification_eval_transform(cfg: DataConfig) -> PairTransform:
    """Evaluation: images of any size Resize(resize_size) + CenterCrop(image_size); fixed-size ones as they are."""
    steps: list[Any] = [v2.ToImage()]
    if varying_sizes(cfg):
        steps += _resize_center_crop(cfg.resize_size, cfg.image_size)
    return PairTransform(v2.Compose(steps + normalize(cfg)))


def classification_predict_transform(cfg: DataConfig) -> v2.Compose:
    """A new image of any size -> the model's input: the evaluation transform of the training data.

    Datasets of varying sizes: Resize(resize_size) + CenterCrop(image_size), exactly as in evaluation.
    Fixed-size datasets (CIFAR, shapes) evaluate their images as they are; another image is brought to
    that size by Resize(image_size) + CenterCrop(image_size), which leaves an image of that size unchanged.
    """
    resize = cfg.resize_size if varying_sizes(cfg) else cfg.image_size
    return v2.Compose([v2.ToImage(), *_resize_center_crop(resize, cfg.image_size), *normalize(cfg)])


def _resize_center_crop(resize: int, crop: int) -> list[Any]:
    return [v2.Resize(resize, antialias=True), v2.CenterCrop(crop)]


CLASSIFICATION_DATA = TaskData("classification", train=classification_train_transform,
                               eval=classification_eval_transform, predict=classification_predict_transform,
                               fixed_size=True)
