"""The segmentation run that several of these tests read, made once per session (tests/support/trained_runs.py):
a narrow DeepLabV3 (ResNet-18, output stride 16) with SyncBN on 2 processes, 2 optimizer steps, one evaluation on
13 images, each at its own size (data.variable_val_size)."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from tests.support.trained_runs import shared_run

SEG_OVERRIDES = [
    "model=deeplabv3_resnet18", "model.output_stride=16", "model.head_channels=32", "norm=syncbn",
    "data=shapes_seg", "data.train_size=16", "data.val_size=13", "data.image_size=32", "data.crop_size=32",
    "data.base_size=32", "data.batch_size=4", "data.variable_val_size=true", "optim.lr=0.01",
    "sched=poly", "trainer.epochs=1", "trainer.max_steps=2",
]
SEG_VAL_SIZE, SEG_STEPS, SEG_CLASSES = 13, 2, 5


@pytest.fixture(scope="session")
def trained_seg_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The segmentation run's folder (SEG_OVERRIDES): metrics.jsonl, checkpoints/last.pt."""
    yield from shared_run(tmp_path_factory, "seg_run", SEG_OVERRIDES)
