"""evaluate.py on segmentation: the shared DeepLab run's logged metrics reproduced alone and under torchrun, with
a complete mask export at each image's size (tolerances: tests/commands/test_evaluate.py); every segmentation
recipe composes and validates."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from PIL import Image

from tests.commands.test_evaluate import REPO, assert_reproduces, last_val_row, run_cmd, torchrun
from tests.tasks.segmentation.conftest import SEG_CLASSES, SEG_STEPS, SEG_VAL_SIZE


@pytest.mark.slow
def test_tiny_deeplab_trained_on_two_processes_logs_its_evaluation(trained_seg_run: Path) -> None:
    """The shared segmentation run: torchrun 2-process DeepLab (SyncBN) training on shapes_seg."""
    logged = last_val_row(trained_seg_run)
    assert logged["step"] == SEG_STEPS and 0 <= logged["miou"] <= 1


@pytest.mark.slow
def test_tiny_deeplab_trained_on_two_processes_and_evaluated(trained_seg_run: Path, tmp_path: Path) -> None:
    """The shared segmentation run evaluated by evaluate.py alone and on 2 processes."""
    logged = last_val_row(trained_seg_run)
    ckpt = trained_seg_run / "checkpoints" / "last.pt"

    run_cmd([sys.executable, "evaluate.py", f"ckpt={ckpt}", f"out={tmp_path / 'one.json'}"])
    one = json.loads((tmp_path / "one.json").read_text())
    assert {"miou", "pixel_acc", "loss"} <= set(one) and any(k.startswith("iou_") for k in one)
    assert_reproduces(one, logged)

    torchrun(2, "evaluate.py", f"ckpt={ckpt}", f"out={tmp_path / 'two.json'}", f"export={tmp_path / 'masks'}")
    assert_reproduces(json.loads((tmp_path / "two.json").read_text()), logged)
    files = sorted(p.name for p in (tmp_path / "masks").iterdir())
    assert files == [f"{i:06d}.png" for i in range(SEG_VAL_SIZE)]
    sizes = {Image.open(tmp_path / "masks" / f).size for f in files}
    assert len(sizes) > 1  # variable_val_size: each image evaluated (and exported) at its own size
    assert all(np.array(Image.open(tmp_path / "masks" / f)).max() < SEG_CLASSES for f in files)


@pytest.mark.parametrize("experiment", sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml")
                                              if "seg" in p.stem or p.stem.startswith(("voc", "cityscapes"))))
def test_segmentation_recipes_compose_and_validate(experiment: str) -> None:
    from src.config import validate_config

    with initialize_config_dir(str(REPO / "conf"), version_base=None):
        cfg = validate_config(compose("train", overrides=[f"experiment={experiment}"]))
    assert cfg.task == "segmentation" and cfg.sched.name == "poly" and cfg.norm.name == "syncbn"
