"""Segmentation in the run's config validation: its metrics for early stopping and best-k, its data options,
refusals (another task's model or options)."""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from src.config import validate_config

CONF = Path(__file__).resolve().parents[3] / "conf"
SEG = ["model=deeplabv3_resnet18", "data=shapes_seg"]


def _validate(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return validate_config(compose("train", overrides=list(overrides)))


def test_early_stopping_follows_its_metrics_and_per_class_ious() -> None:
    assert _validate(*SEG, "trainer.early_stop.metric=val/miou").trainer.early_stop.name == "miou"
    assert _validate(*SEG, "trainer.early_stop.metric=iou_circle").trainer.early_stop.name == "iou_circle"
    task = _validate(*SEG).resolved_task
    assert task.higher_is_better("iou_circle") and not task.higher_is_better("ema_loss")


def test_segmentation_model_with_classification_data_is_refused() -> None:
    with pytest.raises(ValueError, match="model.name=deeplabv3_resnet18.*data.name=shapes.*data=.*shapes_seg"):
        _validate("model=deeplabv3_resnet18")


@pytest.mark.parametrize("override, message", [
    # Another task's option: the message names this run's task first (its owners come last, whoever they are).
    ("trainer.mixup_alpha=0.2", "trainer.mixup_alpha=0.2 is not read by this run's task, segmentation"),
    ("trainer.label_smoothing=0.1", "trainer.label_smoothing=0.1 is not read by this run's task, segmentation"),
    ("data.resize_size=300", "data.resize_size=300 is not read by this run's task, segmentation"),
    ("data.scale_min=3.0", "data.scale_min and data.scale_max must satisfy 0 < scale_min <= scale_max"),
    ("data.crop_size=4", "data.crop_size must be an integer >= 8, got 4"),
    ("data.min_shapes=5", "data.min_shapes and data.max_shapes must satisfy 1 <= min_shapes <= max_shapes"),
])
def test_options_are_checked_and_other_tasks_refused(override: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _validate(*SEG, override)


def test_its_options_are_refused_by_other_tasks() -> None:
    with pytest.raises(ValueError, match=r"data\.crop_size=32 is not read by this run's task, classification .*: it "
                                         r"is an option of (\w+ and )*segmentation"):
        _validate("data.crop_size=32")
    # A dataset's own keys that a recipe sets do not stop `data=` from swapping the dataset: left unread.
    assert _validate("experiment=shapes_seg_deeplabv3plus", "data=segfolder").data.min_shape_size == 0.15
