"""data.device_transforms: uint8 batches finished on the device are bitwise today's worker-normalised batches
(classification with the recipes' augmentation and random erasing; segmentation image + mask); bad values refused."""
from __future__ import annotations

from typing import Any

import pytest
import torch

from src.data import DataConfig, set_loader_epoch
from tests.support.task_data import build_datasets, build_train_loader
from src.data.device_transforms import device_transforms_enabled, prefetch
from src.config import data_config

CPU = torch.device("cpu")


def _batches(cfg: DataConfig, on_device: bool, seed: int = 3) -> list[tuple[torch.Tensor, Any]]:
    """Every training batch of epoch 1, moved as the trainer moves them."""
    bundle = build_datasets(cfg, seed=seed, device_transforms=on_device)
    assert (bundle.device_transform is not None) == on_device
    loader = build_train_loader(bundle.train, cfg, rank=0, world_size=1, seed=seed)
    set_loader_epoch(loader, 1)
    raw = list(loader)
    if on_device:
        assert all(images.dtype == torch.uint8 for images, _, _ in raw), "the workers must stop before normalisation"
    return list(prefetch(raw, lambda batch: batch.to(CPU, torch.float32, transform=bundle.device_transform), CPU))


def _assert_same(cfg: DataConfig) -> list[tuple[torch.Tensor, Any]]:
    today, device = _batches(cfg, on_device=False), _batches(cfg, on_device=True)
    assert len(today) == len(device) > 0
    for (a, t, _), (b, u, _) in zip(today, device):
        assert a.dtype == b.dtype == torch.float32 and torch.equal(a, b)
        assert t.dtype == u.dtype and torch.equal(t, u)
    return today


def test_classification_with_augmentation_and_random_erasing_is_bitwise_the_same() -> None:
    # The ImageNet v2 recipe's trivialaugment + random erasing, with p raised so that most images are erased.
    cfg = data_config(name="shapes", train_size=16, val_size=4, num_classes=4, batch_size=8,
                     auto_augment="trivialaugment", random_erase=0.7)
    batches = _assert_same(cfg)
    # Erased rectangles are exactly 0 on all 3 channels (the shapes images' noise makes that otherwise unlikely).
    erased = sum(bool(((img == 0).all(0)).sum() >= 4) for images, _, _ in batches for img in images)
    assert erased >= 4, f"only {erased} of 16 images erased: the comparison would not cover random erasing"


def test_setting_resolves_per_device_and_bad_values_are_refused() -> None:
    assert not device_transforms_enabled("auto", "cpu") and device_transforms_enabled("auto", "cuda")
    assert device_transforms_enabled(True, "cpu") and not device_transforms_enabled(False, "cuda")
    for bad in ("yes", 1, None):
        with pytest.raises(ValueError, match="data.device_transforms must be true, false or auto"):
            data_config(device_transforms=bad).validate()
