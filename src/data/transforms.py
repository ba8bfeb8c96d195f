"""Classification transforms (torchvision.transforms.v2) and the PIL -> tensor adapters for datasets."""
from __future__ import annotations

from typing import Any, Callable

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2

from src.data.config import DataConfig
from src.data.device_transforms import EraseBox
from src.data.registry import dataset_entry
from src.data.task_data import TaskData, register_task_data


class PairTransform:
    """Runs a v2 pipeline on an (image, target) pair and returns plain tensors (subclasses stripped).

    Plain tensors collate and move to devices without tv_tensor wrapping rules getting in the way.
    """

    def __init__(self, pipeline: Callable[..., Any]) -> None:
        self.pipeline = pipeline

    def __call__(self, image: Any, target: Any) -> tuple[torch.Tensor, Any]:
        image, target = self.pipeline(image, target)
        if isinstance(target, torch.Tensor):
            target = target.as_subclass(torch.Tensor)
        return image.as_subclass(torch.Tensor), target

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.pipeline!r})"


class NormalizeUint8(v2.Transform):
    """uint8 image -> float32 (x / 255 - mean) / std in one multiply-add; other inputs pass through.

    The same maths as v2.ToDtype(float32, scale=True) followed by v2.Normalize, fused: on 32x32 images
    the two v2 calls cost ~60 us per sample (dispatch, not arithmetic), a visible share of a CPU
    training step; this costs ~10 us.
    """

    def __init__(self, mean: list[float], std: list[float]) -> None:
        super().__init__()
        std_t = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)
        self.scale = 1.0 / (255.0 * std_t)
        self.shift = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1) / std_t

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        if isinstance(inpt, tv_tensors.Image) and inpt.dtype == torch.uint8:
            out = inpt.as_subclass(torch.Tensor).to(torch.float32).mul_(self.scale).sub_(self.shift)
            return tv_tensors.wrap(out, like=inpt)
        return inpt


def normalize(cfg: DataConfig) -> list[Any]:
    """uint8 -> float32 in [0, 1], then per-channel normalisation (fused)."""
    return [NormalizeUint8(list(cfg.mean), list(cfg.std))]


def varying_sizes(cfg: DataConfig) -> bool:
    """Whether data.name's images come in many sizes (registered with varying_sizes=True): ImageNet-style crops."""
    return bool(dataset_entry(cfg.name).info.get("varying_sizes"))


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


def to_image(image: Any) -> tv_tensors.Image:
    """A uint8 [3, H, W] tv_tensors.Image from a PIL image or an HxWx3 array (RGB forced)."""
    if hasattr(image, "convert"):
        image = image.convert("RGB")
    return v2.functional.to_image(image)


def to_mask(mask: Any, lut: torch.Tensor | None = None) -> tv_tensors.Mask:
    """A uint8 [H, W] tv_tensors.Mask from a PIL label image, optionally mapped through a lookup table."""
    t = v2.functional.pil_to_tensor(mask)[0] if hasattr(mask, "getbands") else torch.as_tensor(mask)
    if lut is not None:
        t = lut[t.long()]
    return tv_tensors.Mask(t.to(torch.uint8))


register_task_data(TaskData("classification", train=classification_train_transform, eval=classification_eval_transform,
                            predict=classification_predict_transform, fixed_size=True, resize_then_crop=True,
                            image_only_augmentations=True))
