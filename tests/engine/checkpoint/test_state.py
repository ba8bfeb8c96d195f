"""TrainState and the checkpoint format: a full round trip, clear errors for foreign or broken files, and
files written before the format had a version still resume and evaluate."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from src.config import OptimConfig, SchedConfig
from src.engine.checkpoint.state import FORMAT_VERSION, Progress, TrainState, read_checkpoint
from src.engine.optim import build_ema, build_optimizer, build_scheduler
from src.errors import UserError
from src.models import build_model
from src.models.config import ModelConfig, NormConfig
from src.precision import build_scaler
from tests.engine.legacy_checkpoint import write_format_v0
from tests.support.launch import launch, rows

pytestmark = pytest.mark.usefixtures("restores_rng")  # tests here seed torch's global generator

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


def _state(name: str = "resnet20", num_classes: int = 8) -> TrainState:
    torch.manual_seed(0)
    model = build_model(ModelConfig(name=name), NormConfig(name="bn"), num_classes=num_classes)
    optimizer = build_optimizer(model, OptimConfig(), effective_batch=16)
    scheduler = build_scheduler(optimizer, SchedConfig(warmup_epochs=1), steps_per_epoch=4, total_steps=8)
    config = {"model": {"name": name, "weights": None}, "data": {"name": "shapes", "num_classes": num_classes,
                                                                 "batch_size": 16}}
    return TrainState(model, optimizer, scheduler, build_scaler("none", torch.device("cpu")),
                      build_ema(model, 0.9), config=config)


def test_state_dict_round_trip_restores_every_piece() -> None:
    src = _state()
    src.model(torch.randn(4, 3, 16, 16)).sum().backward()
    src.optimizer.step()
    src.scheduler.step()
    src.ema.update_parameters(src.model)
    src.progress, src.best, src.metrics = Progress(1, 5, 2), [[40.0, "best.pt"]], {"top1": 40.0}
    src.trackers["mlflow"] = {"run_id": "abc", "tracking_uri": "sqlite:///x.db"}
    src.early_stop = {"metric": "top1", "best": 40.0, "best_step": 5, "bad_evaluations": 1, "stopped": False}
    saved = src.state_dict()
    assert saved["format_version"] == FORMAT_VERSION and saved["metrics"] == {"top1": 40.0}
    drawn = torch.rand(4)  # what dropout or MixUp would draw next in the uninterrupted run

    dst = _state()
    dst.load_state_dict(saved)
    assert torch.equal(torch.rand(4), drawn)  # the resumed run draws the same: the RNG states were restored
    assert dst.progress == Progress(1, 5, 2) and dst.best == [[40.0, "best.pt"]]
    assert dst.trackers == src.trackers and dst.early_stop == src.early_stop  # a resume continues both
    old = {k: v for k, v in saved.items() if k not in ("trackers", "early_stop")}  # written before they existed
    dst.load_state_dict(old)
    assert dst.trackers == {} and dst.early_stop == {}
    assert dst.metrics == {}  # an evaluation describes the weights it saw, not a resumed run's next ones
    assert dst.scheduler.state_dict() == src.scheduler.state_dict()
    for key, value in src.model.state_dict().items():
        assert torch.equal(dst.model.state_dict()[key], value)
    momentum = [s["momentum_buffer"] for s in dst.optimizer.state.values()]
    assert momentum and all(torch.equal(a, b["momentum_buffer"]) for a, b in
                            zip(momentum, src.optimizer.state.values()))
    assert torch.equal(dst.ema.n_averaged, src.ema.n_averaged)


def test_a_checkpoint_of_another_model_names_what_differs_once() -> None:
    saved = _state("resnet20", 8).state_dict()
    for name, classes, differs, same in (("resnet32", 8, "model.name", "data.num_classes"),
                                         ("resnet20", 5, "data.num_classes", "model.name")):
        with pytest.raises(UserError) as err:
            _state(name, classes).load_state_dict(saved, source="old/last.pt")
        message = str(err.value)
        stored, current = (("resnet20", name) if differs == "model.name" else (8, classes))
        assert message.startswith("the weights in old/last.pt do not fit this model: the checkpoint was trained "
                                  f"with {differs}={stored}; this run has {differs}={current}."), message
        assert same not in message and message.count(differs) == 2


def test_unreadable_and_foreign_files_name_the_file(tmp_path: Path) -> None:
    torch.save(_state().state_dict(), tmp_path / "good.pt")
    data = (tmp_path / "good.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    (tmp_path / "text.pt").write_text("not a checkpoint")
    for name in ("cut.pt", "text.pt"):
        with pytest.raises(ValueError, match=f"checkpoint {tmp_path / name} cannot be read"):
            read_checkpoint(tmp_path / name)
    torch.save({"weights": torch.ones(2)}, tmp_path / "foreign.pt")
    with pytest.raises(ValueError, match="foreign.pt is not a SyncTrain checkpoint"):
        read_checkpoint(tmp_path / "foreign.pt")
    torch.save({**torch.load(tmp_path / "good.pt", weights_only=True), "format_version": FORMAT_VERSION + 1},
               tmp_path / "future.pt")
    with pytest.raises(ValueError, match="newer than this code"):
        read_checkpoint(tmp_path / "future.pt")
