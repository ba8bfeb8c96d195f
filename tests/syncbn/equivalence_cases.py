"""The SyncBN equivalence cases (layer kind, channels, per-rank batches, layout, dtype, steps), shared by the
gloo equivalence test (test_distributed_equivalence.py) and its emulated-kernel subset (test_emulated_syncbn.py)."""
from __future__ import annotations

import inspect

import torch
from torch import nn

# nn.BatchNorm takes bias= from PyTorch 2.13 (2.11's has none): there a bias-free layer has no oracle.
BATCHNORM_TAKES_BIAS = "bias" in inspect.signature(nn.BatchNorm2d.__init__).parameters


def shapes(batches: list[int], rest: tuple[int, ...], channels: int, world: int, steps: int = 1) -> list:
    """Per-step, per-rank shapes: rank r holds batches[r] samples (varied a little per step)."""
    return [[((batches[r] + s) if batches[r] else 0, channels) + rest for r in range(world)] for s in range(steps)]


# name -> (layer class, channels, per-rank batch sizes for up to 3 ranks, trailing dims, make_case options)
CASES = {
    "bn1d_nc_equal": ("1d", 5, [4, 4, 4], (), {}),
    "bn1d_ncl_unequal": ("1d", 3, [3, 5, 1], (7,), {}),
    "bn2d_equal": ("2d", 4, [2, 2, 2], (5, 6), {}),
    "bn2d_unequal": ("2d", 4, [1, 3, 2], (3, 4), {}),
    "bn3d_unequal": ("3d", 3, [2, 1, 3], (3, 4, 2), {}),
    "generic_2d": ("generic", 4, [3, 2, 2], (), {}),
    "generic_5d": ("generic", 2, [1, 2, 1], (2, 3, 2), {}),
    "rank_with_zero_samples": ("2d", 3, [0, 4, 2], (3, 3), {}),
    "all_ranks_empty": ("2d", 3, [0, 0, 0], (3, 3), {"steps": 2}),
    "one_sample_per_rank": ("1d", 4, [1, 1, 1], (), {}),
    "one_rank_single_value": ("1d", 4, [1, 5, 2], (), {}),
    "affine_false": ("2d", 3, [2, 3, 1], (4, 4), {"kwargs": {"affine": False}}),
    **({"bias_false": ("2d", 3, [2, 3, 1], (4, 4), {"kwargs": {"bias": False}})} if BATCHNORM_TAKES_BIAS else {}),
    "no_running_stats": ("2d", 3, [2, 3, 1], (4, 4), {"kwargs": {"track_running_stats": False}}),
    "momentum_none_3_steps": ("2d", 3, [2, 1, 3], (3, 3), {"kwargs": {"momentum": None}, "steps": 3}),
    "momentum_eps_custom_2_steps": ("1d", 6, [3, 2, 4], (5,), {"kwargs": {"momentum": 0.3, "eps": 1e-3}, "steps": 2}),
    "channels_last": ("2d", 5, [2, 3, 1], (4, 5), {"fmt": "channels_last"}),
    "channels_last_3d": ("3d", 4, [2, 1, 2], (2, 3, 4), {"fmt": "channels_last_3d"}),
    "strided_input": ("2d", 3, [2, 3, 1], (4, 4), {"fmt": "strided"}),
    "float64": ("2d", 3, [3, 2, 4], (4, 5), {"dtype": torch.float64, "steps": 2}),
    "float64_large_mean": ("2d", 3, [3, 2, 4], (4, 5), {"dtype": torch.float64, "loc": 1e4, "steps": 2}),
    # Means of -1e30 (1e3 std): n * mean, the squared deviations and the running variance (~1e53) stay exact.
    "float64_extreme_mean": ("1d", 3, [3, 0, 4], (5,), {"dtype": torch.float64, "loc": -1e30, "scale": 1e27}),
    "float32_large_mean": ("2d", 3, [4, 4, 4], (6, 6), {"loc": 1e4, "steps": 2}),
    "bfloat16": ("2d", 4, [2, 3, 1], (5, 5), {"dtype": torch.bfloat16, "steps": 2}),
    "float16": ("2d", 4, [2, 3, 1], (5, 5), {"dtype": torch.float16}),
    "bfloat16_channels_last": ("2d", 4, [2, 3, 1], (5, 5), {"dtype": torch.bfloat16, "fmt": "channels_last"}),
}
