"""predict.py's keys for detection (src/dataclass_config.py, `extend`): which boxes are written, and whether the
inputs are drawn with them."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DetectionPredict:
    """predict.py's keys for detection."""

    score_threshold: float = 0.3  # boxes scoring less are not written (or drawn)
    draw: bool = False  # also out/boxes/<input path>.png, each input (enlarged) with its boxes drawn
    # draw=true draws one box per object: of boxes overlapping by IoU > 0.5, whatever their classes, the best
    # (src/tasks/detection/pictures.py); true draws every box scoring at least score_threshold.
    draw_every_box: bool = False

    def validate(self) -> None:
        """Raise ValueError naming the bad key."""
        if not 0.0 <= self.score_threshold <= 1.0:
            raise ValueError(f"score_threshold is a score in [0, 1], got {self.score_threshold}")
