"""Batch: what every loader yields, for every task: images, targets and the samples' dataset indices.

    images   a stacked float (or uint8, data.device_transforms) tensor [N, 3, H, W]; or a list of N [3, H, W]
             tensors when the images keep their own sizes and the model batches them itself (detection); or the
             encoded files of data.decode_on_device (src/data/device_decode.py)
    targets  the task's: class indices [N], masks [N, H, W], a list of per-image dicts, ... (None for predict.py)
    indices  int64 [N] on the CPU: each sample's index in its dataset (evaluation and predict.py gather by it)

The loop, evaluation, predict.py, export and the dry run move and describe a batch through these methods and
never look at what its images are: this module is the one place that does. A task whose samples do not stack
(images of several sizes, targets with a number of boxes per image) collates with `collate_lists`.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional, Sequence

import torch
from torch.utils.data import default_collate

from src.data.device_transforms import DeviceTransform, move_batch, move_to


class Batch(NamedTuple):
    """One batch of samples (module docstring). A NamedTuple: DataLoader's pin_memory and unpacking handle it."""

    images: Any
    targets: Any
    indices: torch.Tensor

    @property
    def size(self) -> int:
        """The number of samples."""
        return int(self.indices.numel())

    def to(self, device: torch.device, dtype: torch.dtype, transform: Optional[DeviceTransform] = None) -> Batch:
        """This batch on `device`, images in the model's `dtype`; with `transform` (data.device_transforms) the
        uint8 images are finished there (decoded too, with data.decode_on_device). Indices stay on the CPU."""
        if isinstance(self.images, list):  # each image at its own size: the model batches them itself
            images = [image.to(device, dtype, non_blocking=True) for image in self.images]
            return Batch(images, move_to(self.targets, device), self.indices)
        images, targets = move_batch(self.images, self.targets, device=device, dtype=dtype, transform=transform)
        return Batch(images, targets, self.indices)

    def channels_last(self) -> Batch:
        """Stacked images in the channels_last memory format (trainer.channels_last); a list of images, which the
        model batches itself, as it is (the tasks that collate lists refuse trainer.channels_last)."""
        if isinstance(self.images, list):
            return self
        return self._replace(images=self.images.contiguous(memory_format=torch.channels_last))

    def describe(self) -> str:
        """The images' shape in a few words, for the dry run's summary."""
        if isinstance(self.images, list):
            first = tuple(self.images[0].shape) if self.images else ()
            return f"{len(self.images)} image(s), the first {first}"
        return str(tuple(self.images.shape))


def as_batch(batch: Any) -> Batch:
    """A loader's batch as a Batch: a Batch, or an (images, targets, indices) sequence (torch's default_collate of
    IndexedDataset's triples); ValueError saying how to build the loader otherwise."""
    if isinstance(batch, Batch):
        return batch
    if isinstance(batch, (tuple, list)) and len(batch) == 3:
        return Batch(batch[0], batch[1], torch.as_tensor(batch[2], dtype=torch.int64).cpu())
    raise ValueError("a loader must yield (images, targets, indices) Batches; build it with src.data's "
                     "build_train_loader / build_eval_loader, whose datasets add each sample's index")


def collate_stacked(samples: Sequence[tuple[Any, Any, int]]) -> Batch:
    """[(image, target, index), ...] of one size -> Batch with images and targets stacked (torch's default_collate);
    targets None (predict.py's inputs) stay None."""
    targets = [s[1] for s in samples]
    return Batch(default_collate([s[0] for s in samples]),
                 None if all(t is None for t in targets) else default_collate(targets), _indices(samples))


def collate_lists(samples: Sequence[tuple[Any, Any, int]]) -> Batch:
    """[(image, target, index), ...] -> Batch with the images and the targets as lists in sample order: images of
    several sizes, targets that do not stack (torchvision's detection models take exactly this)."""
    targets = [s[1] for s in samples]
    return Batch([s[0] for s in samples], None if all(t is None for t in targets) else targets, _indices(samples))


def _indices(samples: Sequence[tuple[Any, Any, int]]) -> torch.Tensor:
    return torch.tensor([int(s[2]) for s in samples], dtype=torch.int64)
