"""What runs on the device when data.device_transforms is on: uint8 -> float32, normalisation, random erasing.

The training workers then stop before normalisation and hand over uint8 images (a quarter of the float32
bytes to pin and copy); `move_batch` copies a batch to the device (non_blocking, from pinned memory) and
finishes it there with the maths of NormalizeUint8 and v2.RandomErasing(value=0), so the model sees the
same tensors as when the workers normalise. Random erasing's rectangles are still drawn in the workers,
under each sample's seed (src/data/seeded.py), and travel with the target as `ErasedTarget`; only the
zeroing runs here. `prefetch` copies the next batch on a side CUDA stream while the current one trains (with
data.decode_on_device: decodes and augments it on a producer thread).

    transform = DeviceTransform.from_config(cfg) if device_transforms_enabled(cfg, device) else None
    for batch in prefetch(loader, partial(Batch.to, device=device, dtype=dtype, transform=transform)):
        ...                                     # Batch: src/data/batch.py, whose `to` calls move_batch
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Optional

import torch
from torchvision.transforms import v2

from src.data.device_decode import DeviceDecoder, EncodedImages

AUTO = "auto"


def device_transforms_enabled(setting: Any, device: torch.device | str) -> bool:
    """data.device_transforms resolved for `device`: "auto" means on for CUDA, off elsewhere."""
    if setting == AUTO:
        return torch.device(device).type == "cuda"
    return bool(setting)


class ErasedTarget(NamedTuple):
    """A target with its random-erasing rectangle (i, j, h, w); h = w = 0 when nothing is erased.

    A NamedTuple so that default_collate batches it field by field: targets [B], boxes [B, 4].
    """

    target: Any
    box: torch.Tensor


class EraseBox(v2.RandomErasing):
    """v2.RandomErasing's random draws, in the same order, but the rectangle is returned, not erased.

    (image, target) -> (image, ErasedTarget(target, box)): the image is left as it is (uint8), so the
    device can erase it after normalisation exactly where the workers would have.
    """

    def __init__(self, p: float) -> None:
        super().__init__(p=p, value=0)

    def forward(self, *inputs: Any) -> Any:
        image, target = inputs if len(inputs) > 1 else inputs[0]
        box = torch.zeros(4, dtype=torch.int64)
        # The same draws as _RandomApplyTransform.forward and RandomErasing.make_params (value given: no normal_).
        if torch.rand(1) < self.p:
            params = self.make_params([image])
            if params["v"] is not None:
                box = torch.tensor([params["i"], params["j"], params["h"], params["w"]], dtype=torch.int64)
        return image, ErasedTarget(target, box)


class DeviceTransform:
    """uint8 [B, 3, H, W] images -> float32 (x / 255 - mean) / std, then the erasing rectangles set to 0.

    The same operations, in the same order and precision, as NormalizeUint8 then v2.RandomErasing(value=0):
    bitwise the same result on the same device (elementwise IEEE float32 multiply and subtract).
    """

    def __init__(self, mean: list[float], std: list[float], decoder: Optional[DeviceDecoder] = None) -> None:
        self.decoder = decoder  # data.decode_on_device: batches arrive as file bytes (src/data/device_decode.py)
        std_t = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)
        self.scale = 1.0 / (255.0 * std_t)
        self.shift = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1) / std_t
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    @classmethod
    def from_config(cls, cfg: Any, decoder: Optional[DeviceDecoder] = None) -> "DeviceTransform":
        """From a DataConfig's mean and std (and the decoder of data.decode_on_device)."""
        return cls(list(cfg.mean), list(cfg.std), decoder)

    def __call__(self, images: torch.Tensor, targets: Any) -> tuple[torch.Tensor, Any]:
        if images.dtype != torch.uint8:
            raise TypeError(f"data.device_transforms expects uint8 images from the loader, got {images.dtype}; "
                            "build the datasets with build_datasets(..., device_transforms=True)")
        scale, shift = self._constants(images.device)
        out = images.to(torch.float32).mul_(scale).sub_(shift)
        if isinstance(targets, ErasedTarget):
            out = _erase(out, targets.box.to(out.device, non_blocking=True))
            targets = targets.target
        return out, targets

    def _constants(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._on:
            self._on[device] = (self.scale.to(device), self.shift.to(device))
        return self._on[device]


def _erase(images: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """Zero images[b, :, i:i+h, j:j+w] for every box (i, j, h, w): one masked fill, no host synchronisation."""
    height, width = images.shape[-2:]
    rows = torch.arange(height, device=images.device)
    cols = torch.arange(width, device=images.device)
    i, j, h, w = (boxes[:, k].view(-1, 1) for k in range(4))
    in_rows = (rows >= i) & (rows < i + h)  # [B, H]
    in_cols = (cols >= j) & (cols < j + w)  # [B, W]
    mask = (in_rows[:, :, None] & in_cols[:, None, :])[:, None]  # [B, 1, H, W], broadcast over channels
    return images.masked_fill_(mask, 0.0)


def move_batch(images: torch.Tensor | EncodedImages, targets: Any, *, device: torch.device, dtype: torch.dtype,
               transform: Optional[DeviceTransform] = None) -> tuple[torch.Tensor, Any]:
    """A loader's (images, targets) on `device`, images in `dtype`; with `transform`, finished there first.

    With data.decode_on_device the loader's images are EncodedImages: decoded and augmented on the device
    (transform.decoder) before the normalisation.
    """
    if isinstance(images, EncodedImages):
        if transform is None or transform.decoder is None:
            raise TypeError("the loader yields encoded images (data.decode_on_device) but no decoder was given: "
                            "pass transform=bundle.device_transform")
        images, targets = transform.decoder(images, targets, torch.device(device))
    elif transform is None:
        return images.to(device, dtype, non_blocking=True), _targets_to(targets, device)
    else:
        images = images.to(device, non_blocking=True)
    images, targets = transform(images, _targets_to(targets, device))
    return images.to(dtype), targets


def _targets_to(targets: Any, device: torch.device) -> Any:
    if isinstance(targets, ErasedTarget):
        return ErasedTarget(move_to(targets.target, device), targets.box)  # box: moved by the transform
    return move_to(targets, device)


def move_to(value: Any, device: torch.device) -> Any:
    """Every tensor in `value` (a tensor, or lists, tuples and dicts of them; None) on `device`, non-blocking."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, dict):
        return {k: move_to(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        moved = [move_to(v, device) for v in value]
        return type(value)(*moved) if hasattr(value, "_fields") else type(value)(moved)
    return value


def prefetch(batches: Iterable[Any], move: Callable[[Any], Any], device: torch.device,
             threaded: bool = False) -> Iterator[Any]:
    """move(batch) for each batch; on CUDA one batch ahead, on a side stream, so copies overlap compute.

    The side stream waits for the current stream before each copy (the pinned source and the caching
    allocator's memory are the current stream's), the current stream waits for the side stream before
    a batch is handed out, and record_stream tells the allocator the tensors are used on the current
    stream. Elsewhere (CPU) it is plain `move`, batch by batch, and needs no CUDA.

    threaded (data.decode_on_device, whose `move` decodes and augments: tens of milliseconds of kernel launches
    per batch): `move` runs one batch ahead on a producer thread, with a stream of its own on CUDA, while this
    thread trains; this thread still draws the batches from `batches` (the loader, whose own work may use
    the global RNG). `move` must draw nothing from torch's global RNG (DeviceDecoder replays drawn plans).
    A batch is handed out once the producer has issued it: its stream's work is waited for on the device
    (an event), never by the host. An error on the producer is raised here.
    """
    if threaded:
        yield from _threaded_prefetch(batches, move, torch.device(device))
        return
    if torch.device(device).type != "cuda":
        for batch in batches:
            yield move(batch)
        return
    current = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)

    def issue(batch: Any) -> Any:
        side.wait_stream(current)
        with torch.cuda.stream(side):
            return move(batch)

    it = iter(batches)
    ahead = next(it, None)
    pending = issue(ahead) if ahead is not None else None
    while pending is not None:
        current.wait_stream(side)
        for t in _tensors(pending):
            t.record_stream(current)
        ready = pending
        ahead = next(it, None)
        pending = issue(ahead) if ahead is not None else None
        yield ready


def _threaded_prefetch(batches: Iterable[Any], move: Callable[[Any], Any], device: torch.device) -> Iterator[Any]:
    """prefetch(threaded=True): `move` on one producer thread, one batch ahead (see prefetch)."""
    cuda = device.type == "cuda"
    if cuda and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    current = torch.cuda.current_stream(device) if cuda else None
    stream = torch.cuda.Stream(device) if cuda else None

    def produce(batch: Any) -> tuple[Any, Any]:
        if not cuda:
            return move(batch), None
        # No wait for the training stream: the producer's memory is its own stream's (the caching allocator
        # keeps a pool per stream; what is handed out is recorded as used on the training stream below), and
        # the pinned memory it copies from is recorded on its stream by the copies themselves.
        with torch.cuda.device(device), torch.cuda.stream(stream):
            out = move(batch)
            done = torch.cuda.Event()
            done.record(stream)
        return out, done

    # One worker: batches are produced in order. Leaving the loop early (an exception, a stop) waits for the
    # batch in flight (the executor's exit), so nothing runs on after the loop.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefetch") as producer:
        it = iter(batches)
        ahead = next(it, None)
        pending = producer.submit(produce, ahead) if ahead is not None else None
        while pending is not None:
            ready, done = pending.result()
            ahead = next(it, None)
            pending = producer.submit(produce, ahead) if ahead is not None else None
            if done is not None:
                current.wait_event(done)
                for t in _tensors(ready):
                    t.record_stream(current)
            yield ready


def _tensors(batch: Any) -> Iterator[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, (tuple, list)):
        for item in batch:
            yield from _tensors(item)
    elif isinstance(batch, dict):
        for item in batch.values():
            yield from _tensors(item)

