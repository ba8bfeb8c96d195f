"""data.photometric_spread: per-image statistics that vary, with the scene itself unchanged."""
from __future__ import annotations

import numpy as np
import pytest

from src.config import data_config
from src.data.config import DataConfig
from src.data.datasets.shapes import drawing


def test_zero_spread_is_the_plain_generator() -> None:
    plain, label = drawing.make_classification_image(0, "train", 5, 32, 6)
    same, same_label = drawing.make_classification_image(0, "train", 5, 32, 6, photometric_spread=0.0)
    assert label == same_label and np.array_equal(plain, same)


def test_spread_keeps_the_scene_and_the_mask() -> None:
    _, plain_mask = drawing.make_segmentation_image(0, "train", 9, 48, 4)
    img, mask = drawing.make_segmentation_image(0, "train", 9, 48, 4, photometric_spread=1.0)
    again, _ = drawing.make_segmentation_image(0, "train", 9, 48, 4, photometric_spread=1.0)
    assert np.array_equal(mask, plain_mask) and np.array_equal(img, again)


def test_spread_scatters_the_per_image_means() -> None:
    def spread_of_means(spread: float) -> float:
        means = [drawing.make_classification_image(0, "train", i, 32, 6, photometric_spread=spread)[0].mean()
                 for i in range(64)]
        return float(np.std(means))

    # Measured: 31 without and 48 with spread 1 (0..255 units; the backgrounds already vary, and clipping
    # to 0..255 caps the rest).
    assert spread_of_means(1.0) > 1.4 * spread_of_means(0.0)


@pytest.mark.parametrize("bad", [-0.1, 1.5])
def test_spread_out_of_range_is_rejected(bad: float) -> None:
    with pytest.raises(ValueError, match="photometric_spread"):
        data_config(photometric_spread=bad).validate()
