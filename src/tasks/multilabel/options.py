"""The keys multi-label classification reads: classification's `data` keys (its transforms are classification's:
src/tasks/classification/options.py, one key each) and predict.py's `threshold`."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class MultiLabelPredict:
    """predict.py's key for multi-label classification."""

    threshold: float = 0.5  # a class is among an image's labels when its probability is at least this

    def validate(self) -> None:
        """Raise ValueError naming the bad key."""
        value = self.threshold
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
            raise ValueError(f"threshold is a probability in (0, 1), got {value!r}")
