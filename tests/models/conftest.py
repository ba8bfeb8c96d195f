"""Model tests: one intra-op thread (the machine is shared) and a fixed seed per test, both put back after it."""
from __future__ import annotations

from typing import Iterator

import pytest
import torch

from tests.support import process_state


@pytest.fixture(autouse=True)
def _one_thread_fixed_seed() -> Iterator[None]:
    with process_state.restoring("torch intra-op threads", "torch's global RNG"):
        torch.set_num_threads(1)
        torch.manual_seed(0)
        yield
