"""Instance segmentation through the commands: a 2-process SyncBN training (torchrun), evaluate.py and predict.py
on its checkpoint (RLE masks, drawn overlays), export.py's refusal, and what the task refuses at validation."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from PIL import Image

from src.config import validate_config
from src.tasks.instance_segmentation.masks import decode
from tests.support.coco_files import varied_coco, with_segmentations, write_coco_folder
from tests.support.launch import REPO, launch, rows

INST = ["model=maskrcnn_resnet18", "model.head_channels=32", "data=shapes_inst", "data.image_size=48",
        "data.train_size=8", "data.val_size=4", "data.batch_size=2", "data.eval_batch_size=2", "device=cpu", "seed=3",
        "trainer.num_threads=1", "trainer.progress_bar=false"]


def _compose(name: str, overrides: list[str]):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return compose(name, overrides=overrides)


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_syncbn_mask_rcnn_trains_evaluates_and_predicts(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = launch(2, [*INST, "norm=syncbn", "trainer.epochs=1", "trainer.max_steps=2", "trainer.log_every=1",
                        f"hydra.run.dir={run_dir}"])
    assert result.returncode == 0, result.stdout[-4000:]
    assert [r["step"] for r in rows(run_dir, "train")] == [1, 2]
    (val,) = rows(run_dir, "val")
    assert {"mask_map", "mask_map50", "box_map"} <= set(val) and 0 <= val["mask_map50"] <= 1
    assert "SyncBatchNorm2d x28" in (run_dir / "logs" / "rank0.log").read_text()
    ckpt = run_dir / "checkpoints" / "last.pt"

    from src.commands import evaluate, export, predict

    out = tmp_path / "metrics.json"
    evaluate.run(_compose("evaluate", [f"ckpt={ckpt}", f"out={out}", "device=cpu"]))
    measured = json.loads(out.read_text())
    keys = ("mask_map", "box_map")
    assert {k: measured[k] for k in keys} == pytest.approx({k: val[k] for k in keys})

    inputs = tmp_path / "inputs"
    (inputs / "sub").mkdir(parents=True)
    Image.new("RGB", (56, 40), (200, 30, 30)).save(inputs / "a.png")
    Image.new("RGB", (48, 48), (20, 200, 30)).save(inputs / "sub" / "b.jpg")
    predict.run(_compose("predict", [f"ckpt={ckpt}", f"input={inputs}", f"out={tmp_path / 'pred'}", "num_workers=0",
                                     "draw=true", "score_threshold=0.0"]))
    instances = json.loads((tmp_path / "pred" / "predictions.json").read_text())
    # Two steps leave the model's scores mostly under its own threshold (0.05): rows may be few or none here; the
    # rows' format is tested with instances in tests/tasks/instance_segmentation/test_predictions.py.
    assert {r["file"] for r in instances} <= {"a.png", "sub/b.jpg"}
    for row in instances:
        height, width = (40, 56) if row["file"] == "a.png" else (48, 48)
        assert row["segmentation"]["size"] == [height, width]
        assert decode([row["segmentation"]], height, width).shape == (1, height, width)
    # Enlarged to a long side of at least 512 px (x10 and x11), with a legend on the right when instances are drawn.
    for name, (width, height) in (("a.png", (560, 400)), ("sub/b.png", (528, 528))):
        drawn = Image.open(tmp_path / "pred" / "masks" / name)
        assert drawn.height == height and drawn.width >= width, name

    with pytest.raises(ValueError, match="export.py does not export instance segmentation models"):
        export.run(_compose("export", [f"ckpt={ckpt}", "format=onnx", f"out={tmp_path / 'm.onnx'}"]))


@pytest.mark.slow
def test_mask_rcnn_trains_on_a_coco_folder_with_polygons_and_run_length_masks(tmp_path: Path) -> None:
    """data=coco serves Mask R-CNN (python train.py, one process): masks read from the files (polygons, compressed
    and uncompressed RLE, crowds), two training steps, the evaluation on the file's own ground truth."""
    data = with_segmentations(varied_coco())
    root = write_coco_folder(tmp_path / "coco", data, data)
    run_dir = tmp_path / "run"
    result = launch(0, ["model=maskrcnn_resnet18", "model.head_channels=32", "data=coco", f"data.root={root}",
                        "data.train_split=train", "data.val_split=val", "data.batch_size=2", "data.eval_batch_size=2",
                        "data.num_workers=0", "device=cpu", "trainer.num_threads=1", "trainer.progress_bar=false",
                        "trainer.tensorboard=false", "trainer.max_steps=2", "trainer.log_every=1",
                        f"hydra.run.dir={run_dir}"])
    assert result.returncode == 0, result.stdout[-4000:]
    assert [r["step"] for r in rows(run_dir, "train")] == [1, 2]
    (val,) = rows(run_dir, "val")
    assert {"mask_map", "mask_map50", "box_map"} <= set(val) and 0 <= val["mask_map50"] <= 1


@pytest.mark.parametrize("override, message", [
    ("trainer.label_smoothing=0.1", "trainer.label_smoothing=0.1 is not read by this run's task, "
                                    "instance_segmentation"),
    ("trainer.channels_last=true", "trainer.channels_last=true does not apply to instance_segmentation"),
    ("data.device_transforms=true", "data.device_transforms=true does not apply to instance_segmentation"),
    ("trainer.precise_bn_batches=2", "trainer.precise_bn_batches=2 does not apply to instance_segmentation"),
    ("trainer.compile=true", "trainer.compile=true does not apply to instance_segmentation"),
    ("trainer.best_metric=map", "is not a instance_segmentation metric"),
    ("data=shapes_det", r"\(serves instance_segmentation\) and data.name=shapes_det \(serves detection\) have no "
                        "task in common"),
])
def test_what_instance_segmentation_cannot_do_is_refused_at_validation(override: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_config(_compose("train", [*INST, override]))


def test_best_metric_defaults_to_mask_map() -> None:
    from src.config import best_metric_of

    config = validate_config(_compose("train", INST))
    assert config.task == "instance_segmentation" and best_metric_of(config) == "mask_map"
    assert config.resolved_task.higher_is_better("mask_map") and config.resolved_task.higher_is_better("ema_box_map")


def test_data_coco_serves_detection_and_instance_segmentation_models() -> None:
    coco = ["data=coco", "data.root=/nowhere", "device=cpu"]  # validation reads no file
    assert validate_config(_compose("train", ["model=maskrcnn_resnet18", *coco])).task == "instance_segmentation"
    assert validate_config(_compose("train", ["model=fcos_resnet18", *coco])).task == "detection"
    with pytest.raises(ValueError, match=r"data.name=coco \(serves detection and instance_segmentation\) have no task "
                                         r"in common: .* or a model of the dataset's tasks \(model=fcos_resnet18,"
                                         r".*maskrcnn_"):
        validate_config(_compose("train", ["model=resnet20", *coco]))
