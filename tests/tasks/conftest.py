"""Fixtures of the tasks' tests: a recording TensorBoard writer for their pictures (the one-thread reference
forwards they share with the command tests: tests/conftest.py's one_thread)."""
from __future__ import annotations

import pytest
import torch


class RecordingWriter:
    """Records add_image calls as a SummaryWriter would receive them: `images` holds (tag, image, step)."""

    def __init__(self) -> None:
        self.images: list[tuple[str, torch.Tensor, int]] = []

    def add_image(self, tag: str, image: torch.Tensor, global_step: int, dataformats: str) -> None:
        assert dataformats == "CHW"
        self.images.append((tag, image, global_step))


@pytest.fixture
def writer() -> RecordingWriter:
    """A fresh RecordingWriter."""
    return RecordingWriter()
