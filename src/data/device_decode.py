"""data.decode_on_device: the training workers read JPEG files' bytes; the device decodes and augments them.

Workers (`EncodedFiles`): each sample is its file's bytes (no decoding), its label and its augmentation
seed, mix_seed(seed, epoch, index), the seed SeededTransformDataset would have used. A file that is not
a JPEG (PNG, BMP, ... in the same folder) is decoded in the worker by the usual loader and travels as a
uint8 [3, H, W] image instead. `collate_encoded` keeps the byte strings (of different lengths) as a list.

Device (`DeviceDecoder`, called by device_transforms.move_batch): one batched
torchvision.io.decode_jpeg(list_of_bytes, device=...) call decodes every JPEG of the batch; then each
sample runs the same training transform as in the workers (data.device_transforms' uint8 pipeline,
ending with random erasing's rectangle) under torch's CPU generator seeded with the sample's seed. v2
transforms draw their parameters from that generator whatever device the image is on, so every sample
gets the crop, flip, jitter and policy it would have got in a worker. When the batched call fails (a
JPEG the device's decoder refuses), each JPEG is decoded on its own, and one that still fails is decoded
on the CPU by the workers' loader (PIL) and moved.

On the CPU, decode_jpeg and PIL are the same libjpeg-turbo with the same settings: the batches are
bitwise today's (tests/data/test_decode_on_device.py). On CUDA (nvjpeg) pixels may differ by a few
levels from the CPU's, and resampling uint8 images runs different kernels on the GPU: not bitwise the
CPU's batches, same augmentation parameters.
"""
from __future__ import annotations

import io
import logging
from typing import Any, Callable, NamedTuple, Sequence

import torch
from PIL import Image
from torch.utils.data import Dataset, default_collate
from torchvision import tv_tensors
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms.v2.functional import pil_to_tensor

from src.data.seeded import SeededTransformDataset, mix_seed

log = logging.getLogger(__name__)

JPEG_MAGIC = b"\xff\xd8\xff"  # SOI marker + the first byte of the next marker: every JPEG (JFIF, Exif, raw) starts so


class EncodedSample(NamedTuple):
    """One training sample as a worker hands it over: `data` is the file's bytes (1-D uint8) when `encoded`,
    otherwise the decoded uint8 [3, H, W] image; `seed` seeds its augmentation; `path` names it in errors."""

    data: torch.Tensor
    encoded: bool
    seed: int
    path: str


class EncodedImages(NamedTuple):
    """A batch of EncodedSample fields, as lists (byte strings differ in length); seeds int64 [B]."""

    data: list[torch.Tensor]
    encoded: list[bool]
    seeds: torch.Tensor
    paths: list[str]


class EncodedFiles(SeededTransformDataset):
    """A folder dataset's training split as (EncodedSample, label): files read, not decoded, not augmented.

    `base` needs `samples` ([(path, label)], as torchvision's ImageFolder) and `loader` (path -> PIL image,
    for the files that are not JPEGs). `transform` is the training transform the device runs
    (DeviceDecoder); it is kept here so that the dataset describes the same pipeline as SeededTransformDataset.
    """

    def __init__(self, base: Dataset, transform: Callable[..., Any], seed: int) -> None:
        super().__init__(base, transform, seed, same_size=True)

    @staticmethod
    def collate_fn(samples: Sequence[tuple[EncodedSample, int]]) -> tuple[EncodedImages, torch.Tensor]:
        """The DataLoader's collate_fn for this dataset (build_train_loader picks it up)."""
        return collate_encoded(samples)

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[EncodedSample, int]:  # type: ignore[override]
        epoch, index = key if isinstance(key, tuple) else (self.epoch, key)
        path, target = self.base.samples[index]  # type: ignore[attr-defined]
        seed = mix_seed(self.seed, epoch, index)
        with open(path, "rb") as f:
            raw = f.read()
        if raw.startswith(JPEG_MAGIC):
            return EncodedSample(torch.frombuffer(bytearray(raw), dtype=torch.uint8), True, seed, str(path)), target
        image = _to_tensor(self.base.loader(path))  # type: ignore[attr-defined]
        return EncodedSample(image, False, seed, str(path)), target


def collate_encoded(samples: Sequence[tuple[EncodedSample, int]]) -> tuple[EncodedImages, torch.Tensor]:
    """[(EncodedSample, label)] -> (EncodedImages, labels int64 [B])."""
    items = [s for s, _ in samples]
    return (EncodedImages([s.data for s in items], [s.encoded for s in items],
                          torch.tensor([s.seed for s in items], dtype=torch.int64), [s.path for s in items]),
            torch.tensor([t for _, t in samples], dtype=torch.int64))


class DeviceDecoder:
    """(EncodedImages, labels) -> (uint8 [B, 3, S, S] on `device`, targets) with the workers' training transform.

    `transform` is classification_train_transform(cfg, on_device=True): it returns uint8 images and, with
    random erasing, ErasedTarget targets, which DeviceTransform then normalises and erases.
    """

    def __init__(self, transform: Callable[..., Any]) -> None:
        self.transform = transform

    def __call__(self, batch: EncodedImages, targets: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, Any]:
        images = decode_batch(batch, device)
        out = []
        for image, target, seed in zip(images, targets.tolist(), batch.seeds.tolist()):
            with torch.random.fork_rng(devices=[]):
                # As SeededTransformDataset: only the CPU generator, from which v2 draws its parameters.
                torch.default_generator.manual_seed(seed)
                out.append(self.transform(tv_tensors.Image(image), target))
        return default_collate(out)


def decode_batch(batch: EncodedImages, device: torch.device) -> list[torch.Tensor]:
    """Every sample of `batch` as a uint8 [3, H, W] RGB image on `device`: the JPEGs in one batched call."""
    images: list[torch.Tensor | None] = [None if enc else data.to(device, non_blocking=True)
                                         for data, enc in zip(batch.data, batch.encoded)]
    jpegs = [k for k, enc in enumerate(batch.encoded) if enc]
    if jpegs:
        try:
            decoded = decode_jpeg([batch.data[k] for k in jpegs], mode=ImageReadMode.RGB, device=device)
        except (RuntimeError, ValueError):  # one bad file fails the whole call: one by one, each with its fallback
            decoded = [_decode_one(batch.data[k], batch.paths[k], device) for k in jpegs]
        for k, image in zip(jpegs, decoded):
            images[k] = image
    return images  # type: ignore[return-value]


def _decode_one(data: torch.Tensor, path: str, device: torch.device) -> torch.Tensor:
    try:
        return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
    except (RuntimeError, ValueError) as exc:
        log.warning("data.decode_on_device: %s could not be decoded on %s (%s); decoding it on the CPU",
                    path, device, exc)
    try:
        with Image.open(io.BytesIO(data.cpu().numpy().tobytes())) as img:
            return _to_tensor(img.convert("RGB")).to(device)
    except (OSError, ValueError, SyntaxError) as exc:  # as load_rgb: the error names the file
        raise OSError(f"cannot read image {path}: {exc}") from exc


def _to_tensor(image: Image.Image) -> torch.Tensor:
    """A PIL RGB image as a plain uint8 [3, H, W] tensor (what v2.ToImage makes of it)."""
    return pil_to_tensor(image)
