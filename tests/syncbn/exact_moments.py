"""Exact per-channel mean and biased variance of a float64 tensor, as ratios of integers: the yardstick of the
float64 precision test (test_kernels_float64.py).

A float64 value is an integer times a power of two, so one power of two, 2^e, turns all of a channel's values
into integers; their sum S1 and sum of squares S2 are then exact Python integers, and exactly
    mean = S1 / n * 2^e,   var = (n S2 - S1^2) / n^2 * 2^(2e).
(Plain integers rather than fractions.Fraction, whose normalising gcd on every operation made the test 10x slower.)
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Ratio:
    """The exact value num / den (den > 0)."""

    num: int
    den: int

    def scaled(self, num: int, den: int) -> "Ratio":
        """This value times num / den."""
        return Ratio(self.num * num, self.den * den)

    def relative_error(self, value: float) -> float:
        """|value - self| / |self| (self != 0), rounded once to a float."""
        p, q = float(value).as_integer_ratio()
        return abs(p * self.den - self.num * q) / abs(self.num * q)


def exact_moments(x: torch.Tensor) -> list[tuple[Ratio, Ratio]]:
    """(mean, biased variance) of each channel of x (N, C, *), exactly."""
    rows = x.detach().double().cpu().transpose(0, 1).reshape(x.shape[1], -1).numpy()
    _, exponents = np.frexp(rows)
    e = exponents.min(axis=1) - 53  # every value of row c / 2^e[c] is an integer (53-bit significands)
    scaled = np.ldexp(rows, -e[:, None])
    assert np.isfinite(scaled).all(), "a channel's values span too many binades for one scale"
    out = []
    for row, ec in zip(scaled, e.tolist()):
        ints = list(map(int, row.tolist()))
        n, s1, s2 = len(ints), sum(ints), sum(map(operator.mul, ints, ints))
        up, down = (2**ec, 1) if ec >= 0 else (1, 2**-ec)
        out.append((Ratio(s1 * up, n * down), Ratio((n * s2 - s1 * s1) * up * up, n * n * down * down)))
    return out
