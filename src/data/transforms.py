"""What every task's transforms share (torchvision.transforms.v2): the (image, target) pipeline runner, the fused
normalisation, and the PIL -> tensor adapters of the datasets."""
from __future__ import annotations

from typing import Any, Callable

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2

from src.data.config import DataConfig
from src.data.registry import dataset_entry


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

