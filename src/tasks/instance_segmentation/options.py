"""predict.py's keys for instance segmentation (src/dataclass_config.py, `extend`): which instances are written,
and whether the inputs are drawn with them. The same keys, types and defaults as detection's, so one key each."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class InstanceSegmentationPredict:
    """predict.py's keys for instance segmentation."""

    score_threshold: float = 0.3  # instances scoring less are not written (or drawn)
    draw: bool = False  # also out/masks/<input path>.png, each input (enlarged) with its masks and boxes drawn
    draw_every_box: bool = False  # as detection's: true draws every instance, not only the best per object

    def validate(self) -> None:
        """Raise ValueError naming the bad key."""
        if not 0.0 <= self.score_threshold <= 1.0:
            raise ValueError(f"score_threshold is a score in [0, 1], got {self.score_threshold}")
