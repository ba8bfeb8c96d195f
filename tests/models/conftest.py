"""Model tests: one intra-op thread (the machine is shared) and a fixed seed per test."""
from __future__ import annotations

from typing import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread_fixed_seed() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield
    torch.set_num_threads(threads)
