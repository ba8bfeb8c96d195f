"""data.decode_on_device: the training workers read JPEG files' bytes and draw each sample's augmentation; the
device decodes and augments them, off the training thread.

Workers (`EncodedFiles`): each sample is its file's bytes (no decoding), its augmentation plan and its
target. The plan is the training transform's random choices for the sample (crop box, flip, jitter
factors, policy operations...), drawn under the seed SeededTransformDataset would have used,
mix_seed(seed, epoch, index), on a stand-in of the image's size read from the JPEG header, without
touching a pixel (src/data/replay.py); the target comes out transformed (random erasing's rectangle:
ErasedTarget). A file that is not a JPEG (PNG, BMP, ... in the same folder) is decoded in the worker by
the usual loader and travels as a uint8 [3, H, W] image instead, with its plan. `collate_encoded` keeps
the byte strings (of different lengths) as a list.

Device (`DeviceDecoder`, called by device_transforms.move_batch, on the producer thread of
device_transforms.prefetch when training on CUDA): one batched torchvision.io.decode_jpeg(list_of_bytes,
device=...) call decodes every JPEG of the batch, then each sample's plan is replayed on its image. Replay
draws nothing, so it may run on another thread than training (whose global RNG MixUp/CutMix and the
checkpoint use). When the batched call fails (a JPEG the device's decoder refuses), each JPEG is decoded on
its own, and one that still fails is decoded on the CPU by the workers' loader (PIL) and moved.

CUDA streams: decode_jpeg(device="cuda") allocates its outputs on the caller's current stream but writes
them on a stream of its own without waiting for the caller's (pytorch/vision PR 9606), so memory the
caching allocator hands it must not be memory that kernels on the caller's stream may still read. The
decoder therefore runs under a stream of its own (`decode_stream`) that holds nothing but decoder outputs;
the stream that uses an image then waits for it (wait_stream) and marks the image as used there
(record_stream), so the allocator does not give its memory to the next decode before that use is done.

On the CPU, decode_jpeg and PIL are the same libjpeg-turbo with the same settings: the batches are
bitwise today's (tests/data/test_decode_on_device.py). On CUDA (nvjpeg) pixels may differ by a few
levels from the CPU's, and resampling uint8 images runs different kernels on the GPU: not bitwise the
CPU's batches, same augmentation parameters.
"""
from __future__ import annotations

import contextlib
import io
import logging
from typing import Any, Callable, NamedTuple, Sequence

import torch
from PIL import Image
from torch.utils.data import Dataset, default_collate
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms.v2.functional import pil_to_tensor

from src.data.replay import Recorder, Step, replay
from src.data.seeded import SeededTransformDataset, mix_seed

log = logging.getLogger(__name__)

JPEG_MAGIC = b"\xff\xd8\xff"  # SOI marker + the first byte of the next marker: every JPEG (JFIF, Exif, raw) starts so


class EncodedSample(NamedTuple):
    """One training sample as a worker hands it over: `data` is the file's bytes (1-D uint8) when `encoded`,
    otherwise the decoded uint8 [3, H, W] image; `plan` is its augmentation (replay.Step list); `path` names
    it in errors."""

    data: torch.Tensor
    encoded: bool
    plan: list[Step]
    path: str


class EncodedImages(NamedTuple):
    """A batch of EncodedSample fields, as lists (byte strings differ in length)."""

    data: list[torch.Tensor]
    encoded: list[bool]
    plans: list[list[Step]]
    paths: list[str]


class EncodedFiles(SeededTransformDataset):
    """A folder dataset's training split as (EncodedSample, target): files read, not decoded, augmentation drawn.

    `base` needs `samples` ([(path, label)], as torchvision's ImageFolder) and `loader` (path -> PIL image,
    for the files that are not JPEGs). `transform` is the training transform the device replays
    (DeviceDecoder has the same one); here its random choices are drawn (replay.Recorder).
    """

    def __init__(self, base: Dataset, transform: Callable[..., Any], seed: int) -> None:
        super().__init__(base, transform, seed, same_size=True)
        self._recorder: Recorder | None = None  # made in the process that loads (a worker's own copy)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_recorder": None}  # its wrapped methods do not pickle; rebuilt where used

    @staticmethod
    def collate_fn(samples: Sequence[tuple[EncodedSample, Any]]) -> tuple[EncodedImages, Any]:
        """The DataLoader's collate_fn for this dataset (build_train_loader picks it up)."""
        return collate_encoded(samples)

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[EncodedSample, Any]:  # type: ignore[override]
        epoch, index = key if isinstance(key, tuple) else (self.epoch, key)
        path, target = self.base.samples[index]  # type: ignore[attr-defined]
        with open(path, "rb") as f:
            raw = f.read()
        if raw.startswith(JPEG_MAGIC):
            data, encoded, shape = torch.frombuffer(bytearray(raw), dtype=torch.uint8), True, _jpeg_shape(raw, path)
        else:
            data = _to_tensor(self.base.loader(path))  # type: ignore[attr-defined]
            encoded, shape = False, tuple(data.shape)
        if self._recorder is None:
            self._recorder = Recorder(self.transform)
        with torch.random.fork_rng(devices=[]):
            # As SeededTransformDataset: only the CPU generator, from which v2 draws its parameters.
            torch.default_generator.manual_seed(mix_seed(self.seed, epoch, index))
            plan, target = self._recorder.record(shape, target)
        return EncodedSample(data, encoded, plan, str(path)), target


def _jpeg_shape(raw: bytes, path: str) -> tuple[int, int, int]:
    """(3, H, W) of the RGB image a JPEG decodes to, from its header (no decoding)."""
    try:
        with Image.open(io.BytesIO(raw)) as img:
            width, height = img.size
    except (OSError, ValueError, SyntaxError) as exc:  # as load_rgb: the error names the file
        raise OSError(f"cannot read image {path}: {exc}") from exc
    return 3, height, width


def collate_encoded(samples: Sequence[tuple[EncodedSample, Any]]) -> tuple[EncodedImages, Any]:
    """[(EncodedSample, target)] -> (EncodedImages, the targets collated as default_collate does)."""
    items = [s for s, _ in samples]
    return (EncodedImages([s.data for s in items], [s.encoded for s in items], [s.plan for s in items],
                          [s.path for s in items]),
            default_collate([t for _, t in samples]))


class DeviceDecoder:
    """(EncodedImages, targets) -> (uint8 [B, 3, S, S] on `device`, targets): the training transform's output for
    each sample's drawn plan. `transform` is classification_train_transform(cfg, on_device=True), as the
    workers' EncodedFiles have it; DeviceTransform then normalises and erases."""

    def __init__(self, transform: Callable[..., Any]) -> None:
        self.transform = transform
        self._streams: dict[torch.device, torch.cuda.Stream] = {}

    def decode_stream(self, device: torch.device) -> torch.cuda.Stream:
        """The stream that holds only this decoder's outputs on a CUDA `device` (the module docstring says why)."""
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device)
        return self._streams[device]

    def __call__(self, batch: EncodedImages, targets: Any, device: torch.device) -> tuple[torch.Tensor, Any]:
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        images = decode_batch(batch, device, self.decode_stream(device) if device.type == "cuda" else None)
        return torch.stack([replay(self.transform, plan, image) for image, plan in zip(images, batch.plans)]), targets


def decode_batch(batch: EncodedImages, device: torch.device,
                 decode_stream: torch.cuda.Stream | None = None) -> list[torch.Tensor]:
    """Every sample of `batch` as a uint8 [3, H, W] RGB image on `device`: the JPEGs in one batched call.

    With `decode_stream` (CUDA), the decoder runs under it, and the caller's current stream waits for it and
    records every decoded image as used there (module docstring)."""
    images: list[torch.Tensor | None] = [None if enc else data.to(device, non_blocking=True)
                                         for data, enc in zip(batch.data, batch.encoded)]
    jpegs = [k for k, enc in enumerate(batch.encoded) if enc]
    if not jpegs:
        return images  # type: ignore[return-value]
    user = torch.cuda.current_stream(device) if decode_stream is not None else None
    with torch.cuda.stream(decode_stream) if decode_stream is not None else contextlib.nullcontext():
        try:
            decoded = decode_jpeg([batch.data[k] for k in jpegs], mode=ImageReadMode.RGB, device=device)
        except (RuntimeError, ValueError):  # one bad file fails the whole call: one by one, each with its fallback
            decoded = [_decode_one(batch.data[k], batch.paths[k], device) for k in jpegs]
    if user is not None:
        user.wait_stream(decode_stream)
        for image in decoded:
            image.record_stream(user)
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
