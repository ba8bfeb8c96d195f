"""Detection through the commands: a 2-process SyncBN training (torchrun), evaluate.py and predict.py on its
checkpoint, export.py's refusal, and what the detection task refuses at config validation."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from PIL import Image

import src.config  # noqa: F401  (registers train_schema)
from src.config import validate_config
from tests.support.launch import REPO, launch, rows

DET = ["model=fcos_resnet18", "model.head_channels=64", "data=shapes_det", "data.image_size=64", "data.train_size=12",
       "data.val_size=5", "data.batch_size=2", "data.eval_batch_size=2", "device=cpu", "seed=3",
       "trainer.num_threads=1", "trainer.progress_bar=false"]


def _compose(name: str, overrides: list[str]):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return compose(name, overrides=overrides)


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_syncbn_detector_trains_evaluates_and_predicts(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = launch(2, [*DET, "norm=syncbn", "trainer.epochs=1", "trainer.max_steps=3", "trainer.log_every=1",
                        f"hydra.run.dir={run_dir}"])
    assert result.returncode == 0, result.stdout[-4000:]
    assert [r["step"] for r in rows(run_dir, "train")] == [1, 2, 3]
    (val,) = rows(run_dir, "val")
    assert {"map", "map50", "map75"} <= set(val) and 0 <= val["map50"] <= 1
    assert "norm health (start): GroupNorm x8, SyncBatchNorm2d x" in (run_dir / "logs" / "rank0.log").read_text()
    ckpt = run_dir / "checkpoints" / "last.pt"

    from src.commands import evaluate, export, predict

    out = tmp_path / "metrics.json"
    evaluate.run(_compose("evaluate", [f"ckpt={ckpt}", f"out={out}", "device=cpu"]))
    measured = json.loads(out.read_text())
    assert {k: measured[k] for k in ("map", "map50")} == pytest.approx({k: val[k] for k in ("map", "map50")})

    inputs = tmp_path / "inputs"
    (inputs / "sub").mkdir(parents=True)
    Image.new("RGB", (80, 60), (200, 30, 30)).save(inputs / "a.png")
    Image.new("RGB", (64, 64), (20, 200, 30)).save(inputs / "sub" / "b.jpg")
    predict.run(_compose("predict", [f"ckpt={ckpt}", f"input={inputs}", f"out={tmp_path / 'pred'}", "num_workers=0",
                                     "draw=true", "score_threshold=0.0"]))
    boxes = json.loads((tmp_path / "pred" / "predictions.json").read_text())
    assert {r["file"] for r in boxes} <= {"a.png", "sub/b.jpg"} and boxes
    assert all(0 <= r["x1"] <= r["x2"] <= 80 and 0 <= r["y1"] <= r["y2"] <= 64 for r in boxes)
    assert Image.open(tmp_path / "pred" / "boxes" / "a.png").size == (80, 60)
    assert Image.open(tmp_path / "pred" / "boxes" / "sub" / "b.png").size == (64, 64)

    with pytest.raises(ValueError, match="export.py does not export detection models"):
        export.run(_compose("export", [f"ckpt={ckpt}", "format=onnx", f"out={tmp_path / 'm.onnx'}"]))


@pytest.mark.parametrize("override, message", [
    ("trainer.mixup_alpha=0.2", "trainer.mixup_alpha applies to classification only; this run is detection"),
    ("trainer.label_smoothing=0.1", "trainer.label_smoothing applies to classification only"),
    ("trainer.channels_last=true", "trainer.channels_last=true does not apply to detection"),
    ("data.device_transforms=true", "data.device_transforms=true does not apply to detection"),
    ("trainer.precise_bn_batches=2", "trainer.precise_bn_batches=2 does not apply to detection"),
    ("trainer.compile=true", "trainer.compile=true does not apply to detection"),
    ("trainer.best_metric=loss", "is not a detection metric"),
    ("data.auto_augment=randaugment", "data.auto_augment applies to classification only"),
    ("model=resnet20", "is a classification model but data.name=shapes_det is a detection dataset"),
])
def test_what_detection_cannot_do_is_refused_at_validation(override: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_config(_compose("train", [*DET, override]))
