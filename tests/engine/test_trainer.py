"""The Trainer's hook protocol: which hook runs when, and how a hook stops the run or forces a checkpoint.

A linear classifier on 12 random features, 3 micro-batches per epoch, on one process: the protocol does
not depend on the model, and these tests run in about a second.
"""
from __future__ import annotations

import signal
from pathlib import Path
from typing import Optional

import pytest
import torch
from torch import nn
from torchvision import tv_tensors

from src.config import TrainerConfig
from src.data.device_transforms import DeviceTransform, ErasedTarget
from src.data.transforms import NormalizeUint8
from src.engine.checkpoint.files import CheckpointSaver, load_checkpoint
from src.engine.checkpoint.state import Progress, TrainState
from src.engine.hooks import CheckpointHook, Hook, StopAtMaxSteps
from src.engine.preemption import PreemptionHook
from src.engine.trainer import Trainer
from src.precision import build_scaler
from src.tasks.classification import classification_loss
from tests.engine.fake_loader import ListLoader

pytestmark = pytest.mark.usefixtures("restores_rng")  # tests here seed torch's global generator


class Recorder(Hook):
    """Records (event, step, epoch, epoch_complete, finishing) and can request a stop or a checkpoint."""

    def __init__(self, stop_at: Optional[int] = None, exit_code: Optional[int] = None,
                 checkpoint_at: Optional[int] = None) -> None:
        self.events: list[tuple] = []
        self.stop_at, self.exit_code, self.checkpoint_at = stop_at, exit_code, checkpoint_at

    def _record(self, event: str, t: Trainer) -> None:
        self.events.append((event, t.state.progress.step, t.epoch, t.epoch_complete, t.finishing))

    def before_train(self, trainer: Trainer) -> None:
        self._record("before_train", trainer)

    def after_step(self, trainer: Trainer) -> None:
        self._record("after_step", trainer)
        step = trainer.state.progress.step
        if step == self.checkpoint_at:
            trainer.request_checkpoint()
        if step == self.stop_at:
            trainer.request_stop("test", exit_code=self.exit_code)

    def after_epoch(self, trainer: Trainer) -> None:
        self._record("after_epoch", trainer)

    def after_train(self, trainer: Trainer) -> None:
        self._record("after_train", trainer)


def make_trainer(tmp_path: Path, hooks: list, epochs: int = 2, progress: Optional[Progress] = None) -> Trainer:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state = TrainState(model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0),
                       build_scaler("none", torch.device("cpu")), config={"data": {"batch_size": 4}})
    if progress is not None:
        state.progress = progress
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, 12, generator=g), torch.randint(0, 3, (4,), generator=g)) for _ in range(3)]
    return Trainer(state, model, ListLoader(batches), classification_loss(),
                   TrainerConfig(epochs=epochs, progress_bar=False), torch.device("cpu"), hooks=hooks,
                   saver=CheckpointSaver(tmp_path, "top1", keep_best=1, higher_is_better=True))


def test_hooks_run_in_protocol_order(tmp_path: Path) -> None:
    rec = Recorder()
    make_trainer(tmp_path, [rec]).train()
    assert rec.events == [
        ("before_train", 0, 0, False, False),
        ("after_step", 1, 0, False, False), ("after_step", 2, 0, False, False), ("after_step", 3, 0, False, False),
        ("after_epoch", 3, 0, True, False),
        ("after_step", 4, 1, True, False), ("after_step", 5, 1, True, False), ("after_step", 6, 1, True, False),
        ("after_epoch", 6, 1, True, True),
        ("after_train", 6, 1, True, True),
    ]


def test_a_stop_mid_epoch_closes_the_partial_epoch(tmp_path: Path) -> None:
    rec = Recorder()
    trainer = make_trainer(tmp_path, [rec, StopAtMaxSteps(4)], epochs=5)
    trainer.train()
    assert [e for e in rec.events if e[0] != "after_step"][-2:] == [
        ("after_epoch", 4, 1, False, True), ("after_train", 4, 1, False, True)]
    assert trainer.state.progress == Progress(epoch=1, step=4, micro_batch=1)
    assert trainer.exit_code is None and trainer.stop_reason == "trainer.max_steps=4 reached"


def test_a_resume_past_max_steps_trains_nothing(tmp_path: Path) -> None:
    rec = Recorder()
    make_trainer(tmp_path, [StopAtMaxSteps(4), rec], epochs=5, progress=Progress(1, 4, 1)).train()
    assert [e[0] for e in rec.events] == ["before_train", "after_train"]


def test_an_interruption_forces_a_checkpoint_and_skips_after_epoch(tmp_path: Path) -> None:
    # The requesting hook runs after CheckpointHook: requests are honoured once every hook has run.
    rec = Recorder(stop_at=2, exit_code=3, checkpoint_at=2)
    trainer = make_trainer(tmp_path, [CheckpointHook(every=0), rec])
    trainer.train()
    assert [e[0] for e in rec.events] == ["before_train", "after_step", "after_step", "after_train"]
    assert trainer.exit_code == 3 and trainer.interrupted
    last = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    assert (last["step"], last["epoch"], last["sampler"]["micro_batch"]) == (2, 0, 2)
    assert last["metrics"] == {} and last["format_version"] == 1


def test_checkpoint_hook_writes_on_its_step_schedule(tmp_path: Path) -> None:
    class Steps(Hook):
        def __init__(self) -> None:
            self.seen: list[int] = []

        def after_step(self, trainer: Trainer) -> None:
            path = tmp_path / "checkpoints" / "last.pt"
            self.seen.append(load_checkpoint(path)["step"] if path.exists() else 0)

    steps = Steps()
    make_trainer(tmp_path, [CheckpointHook(every=2), steps], epochs=1).train()
    # Each hook sees the file as of the previous step: written after step 2's hooks, not before.
    assert steps.seen == [0, 0, 2]
    assert load_checkpoint(tmp_path / "checkpoints" / "last.pt")["step"] == 3  # after the epoch


def test_an_error_inside_training_still_restores_the_sigterm_handler(tmp_path: Path) -> None:
    # A NonFiniteError or a collective's timeout raised mid-run must not leave PreemptionHook's handler
    # installed: in-process callers (tests, notebooks, a sweep) would then silently swallow SIGTERM.
    class Boom(Hook):
        def after_step(self, trainer: Trainer) -> None:
            if trainer.state.progress.step == 2:
                raise RuntimeError("boom at step 2")

    before = signal.getsignal(signal.SIGTERM)
    preemption = PreemptionHook(["SIGTERM"])
    rec = Recorder()
    with pytest.raises(RuntimeError, match="boom at step 2"):
        make_trainer(tmp_path, [rec, Boom(), preemption]).train()
    assert signal.getsignal(signal.SIGTERM) is before
    assert rec.events[-1][0] == "after_train"


def test_device_transform_batches_train_to_the_same_weights_as_normalised_ones(tmp_path: Path) -> None:
    """data.device_transforms in the loop: uint8 batches (with erasing boxes) finished by the trainer's batch
    mover train bitwise like the same batches normalised and erased beforehand, as the workers do otherwise."""
    mean, std = [0.4, 0.5, 0.6], [0.2, 0.25, 0.3]
    transform = DeviceTransform(mean, std)
    g = torch.Generator().manual_seed(2)
    raw = [(torch.randint(0, 256, (4, 3, 2, 2), dtype=torch.uint8, generator=g),
            ErasedTarget(torch.randint(0, 3, (4,), generator=g), torch.tensor([[0, 1, 2, 1]] * 2 + [[0, 0, 0, 0]] * 2)))
           for _ in range(3)]
    normalise = NormalizeUint8(mean, std)
    ready = []
    for images, target in raw:
        x = torch.stack([normalise(tv_tensors.Image(i)).as_subclass(torch.Tensor) for i in images])
        x[:2, :, 0:2, 1:2] = 0  # the boxes (i=0, j=1, h=2, w=1) of the first two images
        ready.append((x, target.target))
    weights = []
    for batches, device_transform in ((ready, None), (raw, transform)):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        state = TrainState(model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0),
                           build_scaler("none", torch.device("cpu")), config={"data": {"batch_size": 4}})
        Trainer(state, model, ListLoader(batches), classification_loss(), TrainerConfig(epochs=1, progress_bar=False),
                torch.device("cpu"), device_transform=device_transform).train()
        weights.append(model[1].weight.detach().clone())
    assert not torch.equal(weights[0], make_trainer(tmp_path, []).state.model[1].weight), "nothing trained"
    assert torch.equal(weights[0], weights[1])
