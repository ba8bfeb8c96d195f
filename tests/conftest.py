"""Suite-wide pytest wiring: `cuda` tests run only where a GPU is present."""
from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked `cuda` on machines without a GPU (CI and most laptops)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marked `cuda`); run scripts/gpu_check.sh on one")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
