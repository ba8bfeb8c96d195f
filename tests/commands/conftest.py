"""Fixtures shared by the command tests."""
from __future__ import annotations

from typing import Iterator

import pytest
import torch


@pytest.fixture
def one_thread() -> Iterator[None]:
    """In-process reference forwards on one thread, like the one-thread command runs they are compared with."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
