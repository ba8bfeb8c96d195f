"""Fixtures of the tasks' tests: a recording TensorBoard writer for their pictures, and the one-thread reference
forwards they share with the command tests (tests/commands/conftest.py)."""
from __future__ import annotations

import pytest
import torch

from tests.commands.conftest import one_thread  # noqa: F401


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
