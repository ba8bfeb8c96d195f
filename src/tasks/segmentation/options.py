"""The keys segmentation adds to the `data` config group (src/dataclass_config.py, `extend`): its training
crops' random scale and size. Checked here; a run of another task refuses them when set."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SegmentationData:
    """data.*: segmentation's training augmentation (evaluation runs each image at its own size)."""

    base_size: int = 0  # random scale acts on the shorter side: [scale_min, scale_max] x base_size (0 = crop_size)
    crop_size: int = 64  # training crop (padded with 0 / ignore 255 when the scaled image is smaller)
    scale_min: float = 0.5
    scale_max: float = 2.0

    def validate(self) -> None:
        """Raise ValueError naming the bad key."""
        for key, low in (("base_size", 0), ("crop_size", 8)):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"data.{key} must be an integer >= {low}, got {value!r}")
        if not 0 < self.scale_min <= self.scale_max:
            raise ValueError(f"data.scale_min and data.scale_max must satisfy 0 < scale_min <= scale_max, "
                             f"got {self.scale_min} and {self.scale_max}")


@dataclass(frozen=True)
class SegmentationOptions:
    """What segmentation's loss reads (Segmentation.options)."""

    aux_weight: float = 0.0  # weight of the auxiliary head's loss (model.aux_loss_weight of the models that have one)


@dataclass
class SegmentationPredict:
    """predict.py's key for segmentation (the same key as detection's, so one key)."""

    draw: bool = False  # also out/overlays/<input path>.png: each input (enlarged) with its mask over it, a legend


@dataclass(frozen=True)
class SegmentationPredictSettings:
    """What Segmentation.predict reads: its key, and the run's normalisation, to show the inputs as they were."""

    draw: bool
    mean: tuple[float, ...]
    std: tuple[float, ...]
