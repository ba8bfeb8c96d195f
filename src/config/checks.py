"""The small value checks the config sections share: each raises ValueError naming the key, its value and what
is allowed."""
from __future__ import annotations

from typing import Any


def one_of(key: str, value: Any, allowed: tuple[str, ...]) -> None:
    """`value` must be one of `allowed`."""
    if value not in allowed:
        raise ValueError(f"{key} must be one of {list(allowed)}, got {value!r}")


def positive(key: str, value: float) -> None:
    """`value` must be > 0."""
    if not value > 0:
        raise ValueError(f"{key} must be > 0, got {value}")


def non_negative_int(key: str, value: Any) -> None:
    """An int >= 0 (a TrainerConfig built in code skips OmegaConf's type check, so the type is checked too)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be a whole number >= 0, got {value!r}")
    non_negative(key, value)


def non_negative(key: str, value: float) -> None:
    """`value` must be >= 0."""
    if not value >= 0:
        raise ValueError(f"{key} must be >= 0, got {value}")
