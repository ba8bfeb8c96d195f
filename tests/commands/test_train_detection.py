"""Detection through the commands: a 2-process SyncBN training (torchrun), evaluate.py and predict.py on its
checkpoint, export.py's refusal, what the detection task refuses at config validation, and evaluate.py and
predict.py writing the same bytes at 1, 2 and 3 processes on a COCO-format folder."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from PIL import Image

from src.config import validate_config
from tests.support.coco_files import VARIED_CLASS_NAMES, varied_coco, write_coco_folder
from tests.support.gloo import run_on_ranks
from tests.support.launch import REPO, launch, rows

# Plain SGD at lr 0.1 for 4 images per step (not the default job's lr, scaled down to 4/128 of 0.2): three steps then
# move FCOS's class scores past its own postprocessing floor (0.2), so that predict.py has boxes to write.
DET = ["model=fcos_resnet18", "model.head_channels=64", "data=shapes_det", "data.image_size=64", "data.train_size=12",
       "data.val_size=5", "data.batch_size=2", "data.eval_batch_size=2", "device=cpu", "seed=3",
       "trainer.num_threads=1", "trainer.progress_bar=false", "optim.lr=0.1", "optim.reference_batch_size=null",
       "optim.nesterov=false"]


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
    # Enlarged to a long side of at least 512 px (x7 and x8), with a legend on the right when boxes are drawn.
    for name, (width, height) in (("a.png", (560, 420)), ("sub/b.png", (512, 512))):
        drawn = Image.open(tmp_path / "pred" / "boxes" / name)
        assert drawn.height == height and drawn.width >= width, name

    with pytest.raises(ValueError, match="export.py does not export detection models"):
        export.run(_compose("export", [f"ckpt={ckpt}", "format=onnx", f"out={tmp_path / 'm.onnx'}"]))


@pytest.mark.parametrize("override, message", [
    ("trainer.mixup_alpha=0.2", "trainer.mixup_alpha=0.2 is not read by this run's task, detection"),
    ("trainer.label_smoothing=0.1", "trainer.label_smoothing=0.1 is not read by this run's task, detection"),
    ("trainer.channels_last=true", "trainer.channels_last=true does not apply to detection"),
    ("data.device_transforms=true", "data.device_transforms=true does not apply to detection"),
    ("trainer.precise_bn_batches=2", "trainer.precise_bn_batches=2 does not apply to detection"),
    ("trainer.compile=true", "trainer.compile=true does not apply to detection"),
    ("trainer.best_metric=loss", "is not a detection metric"),
    ("data.auto_augment=randaugment", "data.auto_augment='randaugment' is not read by this run's task, detection"),
    ("model=resnet20", r"model.name=resnet20 \(serves .*\) and data.name=shapes_det \(serves detection\) have no "
                       "task in common"),
])
def test_what_detection_cannot_do_is_refused_at_validation(override: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_config(_compose("train", [*DET, override]))


def _untrained_checkpoint(path: Path, coco_root: Path) -> None:
    """A checkpoint of an untrained FCOS for data=coco at `coco_root`, written through TrainState as the trainer
    writes one; its classification bias is 0 (scores about 0.5 instead of 0.09), so detections pass the
    default score threshold of 0.2 and there are outputs to compare."""
    from src.config import config_dict
    from src.engine.checkpoint.files import serialize
    from src.engine.checkpoint.state import TrainState
    from src.engine.optim import build_optimizer, build_scheduler
    from src.models import build_model

    config = validate_config(_compose("train", [
        "model=fcos_resnet18", "model.head_channels=64", "norm=syncbn", "data=coco", f"data.root={coco_root}",
        "data.train_split=train", "data.val_split=val", "data.eval_batch_size=2", "data.num_workers=0", "device=cpu"]))
    torch.manual_seed(0)
    model = build_model(config.model, config.norm, len(VARIED_CLASS_NAMES))
    torch.nn.init.zeros_(model.head.classification_head.cls_logits.bias)
    optimizer = build_optimizer(model, config.optim, config.data.batch_size)
    state = TrainState(model, optimizer, build_scheduler(optimizer, config.sched, 1, 1),
                       torch.amp.GradScaler("cpu", enabled=False), config=config_dict(config),
                       class_names=list(VARIED_CLASS_NAMES))
    path.write_bytes(serialize(state.state_dict()))


def _evaluate_and_predict(rank: int, world: int, ckpt: str, images: str, out: str) -> None:
    """evaluate.py with export= and predict.py, as torchrun would run them on `world` processes; the process
    starts with the thread count that trainer.num_threads=0 gives on this node (cores / processes)."""
    from src.commands import evaluate, predict

    out_dir = Path(out)
    evaluate.run(_compose("evaluate", [f"ckpt={ckpt}", f"out={out_dir / 'metrics.json'}",
                                       f"export={out_dir / 'export'}"]))
    predict.run(_compose("predict", [f"ckpt={ckpt}", f"input={images}", f"out={out_dir / 'predict'}", "num_workers=0",
                                     "batch_size=3", "draw=true"]))


@pytest.mark.slow
@pytest.mark.usefixtures("restores_rng")  # its in-process checkpoint seeds torch's global generator
def test_evaluate_and_predict_write_the_same_bytes_at_1_2_and_3_processes(tmp_path: Path) -> None:
    """The reported case, shrunk: a COCO-format folder of images of nine sizes, an FCOS with BatchNorm from a
    SyncBN checkpoint, batches of 2 (evaluation) and 3 (predict.py) that no world size divides."""
    coco_root = write_coco_folder(tmp_path / "coco", varied_coco(), varied_coco())
    # A file no annotation names, which predict.py meets among the images and skips on every rank alike.
    (coco_root / "val" / "img_cut.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    ckpt = tmp_path / "last.pt"
    _untrained_checkpoint(ckpt, coco_root)
    written = {}
    for world in (1, 2, 3):
        out = tmp_path / f"world{world}"
        run_on_ranks(world, _evaluate_and_predict, str(ckpt), str(coco_root / "val"), str(out))
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics.pop("world_size") == world
        files = sorted(p for p in out.rglob("*") if p.is_file() and p.name != "metrics.json")
        written[world] = metrics, {p.relative_to(out).as_posix(): p.read_bytes() for p in files}
    metrics, files = written[1]
    assert {"export/predictions.json", "export/coco_results.json", "predict/predictions.json"} <= set(files)
    assert len(json.loads(files["export/coco_results.json"])) > 100 and "predict/boxes/img57.png" in files
    assert files["predict/unreadable.csv"].decode().splitlines()[1].startswith("img_cut.png,")
    for world in (2, 3):
        assert written[world][0] == metrics, world
        assert written[world][1].keys() == files.keys()
        assert [name for name in files if written[world][1][name] != files[name]] == [], world
