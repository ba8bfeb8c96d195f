"""The checkpoint format: files written before the format had a version still resume and evaluate."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.engine.legacy_checkpoint import write_format_v0
from tests.test_train import launch, rows

# 64 images of 16x16 in batches of 16: 4 optimizer steps per epoch, 2 epochs; a 37-image validation set.
JOB = ["model=resnet20", "norm=bn", "data.train_size=64", "data.val_size=37", "data.image_size=16",
       "data.batch_size=16", "data.eval_batch_size=16", "trainer.epochs=2", "trainer.ema=true", "device=cpu",
       "trainer.num_threads=1", "trainer.progress_bar=false", "trainer.tensorboard=false"]


def test_first_format_checkpoint_resumes_training_and_evaluates(tmp_path: Path) -> None:
    old = tmp_path / "old" / "checkpoints" / "last.pt"
    write_format_v0(old, JOB, epoch=1, step=4, steps_per_epoch=4)

    resumed = launch(0, [*JOB, f"trainer.resume={old}", f"hydra.run.dir={tmp_path / 'new'}"])
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    assert "resumed from" in resumed.stdout
    # Epoch 1 (steps 5..8) is trained and evaluated: the stored progress was used, not step 0.
    assert [(r["epoch"], r["step"]) for r in rows(tmp_path / "new", "val")] == [(1, 8)]

    out = tmp_path / "ema.json"
    evaluated = launch(0, [f"ckpt={old}", "ema=true", f"out={out}"], script="evaluate.py")
    assert evaluated.returncode == 0, evaluated.stdout[-4000:]
    record = json.loads(out.read_text())
    assert (record["step"], record["epoch"], record["weights"]) == (4, 0, "ema")
    assert 0 <= record["top1"] <= 100
