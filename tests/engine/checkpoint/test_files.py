"""Checkpoints: atomic writes survive SIGKILL mid-write, everything loads with weights_only=True,
best-k bookkeeping, RNG round trip, and norm=syncbn weights load into norm=bn and back."""
from __future__ import annotations

import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from src.config import OptimConfig, SchedConfig
from src.engine.checkpoint import files as ckpt_io
from src.engine.optim import build_ema, build_optimizer, build_scheduler
from src.engine.seeding import capture_rng_state, restore_rng_state
from src.models import build_model
from src.models.config import ModelConfig, NormConfig
from src.precision import build_scaler

# Tests here seed torch's global generator, and the RNG-state test draws from numpy's and Python's too.
pytestmark = pytest.mark.usefixtures("restores_rng")

REPO = Path(__file__).resolve().parents[3]

WRITER = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {repo!r})
    from pathlib import Path
    from src.engine.checkpoint.files import CheckpointSaver
    saver = CheckpointSaver(Path({path!r}).parents[1], "top1", keep_best=0, higher_is_better=True)
    i = 0
    while True:  # rewrite last.pt forever with a ~24 MB payload tagged by its generation
        saver.write({{"generation": i, "payload": torch.full((6_000_000,), float(i))}})
        print(i, flush=True)
        i += 1
""")


def test_sigkill_mid_write_leaves_the_previous_checkpoint_loadable(tmp_path: Path) -> None:
    """Kill a process that rewrites last.pt in a loop at 3 different moments: every time, last.pt loads
    and is one complete generation. A non-atomic writer (torch.save straight to last.pt) fails this."""
    path = tmp_path / "checkpoints" / "last.pt"
    for attempt in range(3):
        proc = subprocess.Popen([sys.executable, "-c", WRITER.format(repo=str(REPO), path=str(path))],
                                stdout=subprocess.PIPE, text=True)
        try:
            proc.stdout.readline()  # at least one complete checkpoint exists
            time.sleep(0.05 + 0.1 * attempt)  # land somewhere inside a later write
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        state = ckpt_io.load_checkpoint(path)
        assert torch.equal(state["payload"], torch.full((6_000_000,), float(state["generation"])))
    leftovers = [p.name for p in path.parent.iterdir() if p.name != "last.pt"]
    # A killed writer may leave its temporary file behind, never a half-written last.pt.
    assert all(name.startswith(".last.pt.tmp-") for name in leftovers)


def _training_state(norm: str = "bn") -> dict:
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="resnet20"), NormConfig(name=norm), num_classes=8)
    optim = build_optimizer(model, OptimConfig(name="sgd", head_lr_mult=2.0), effective_batch=64)
    sched = build_scheduler(optim, SchedConfig(name="step", warmup_epochs=1, milestones=[2, 3]),
                            steps_per_epoch=5, total_steps=20)
    scaler = build_scaler("fp16", torch.device("cpu"))
    ema = build_ema(model, 0.9)
    model(torch.randn(4, 3, 16, 16)).sum().backward()
    optim.step()
    sched.step()
    ema.update_parameters(model)
    return {"model": model.state_dict(), "optimizer": optim.state_dict(), "scheduler": sched.state_dict(),
            "scaler": scaler.state_dict(), "ema": ema.state_dict(), "epoch": 1, "step": 7,
            "sampler": {"epoch": 1, "micro_batch": 3}, "rng": [capture_rng_state()],
            "config": {"trainer": {"epochs": 3}, "optim": {"betas": [0.9, 0.999]}}, "metrics": {"top1": 50.0}}


def test_full_training_state_loads_with_weights_only(tmp_path: Path) -> None:
    state = _training_state()
    path = ckpt_io.CheckpointSaver(tmp_path, "top1", keep_best=0, higher_is_better=True).write(state)
    loaded = ckpt_io.load_checkpoint(path)  # weights_only=True inside
    assert loaded["scheduler"] == state["scheduler"]
    assert loaded["sampler"] == state["sampler"] and loaded["config"] == state["config"]
    for key, value in state["model"].items():
        assert torch.equal(loaded["model"][key], value)


def test_rng_state_round_trip() -> None:
    saved = capture_rng_state()
    expected = (random.random(), float(np.random.rand()), torch.rand(3))
    random.random(), np.random.rand(), torch.rand(7)  # move every generator on
    restore_rng_state(saved)
    again = (random.random(), float(np.random.rand()), torch.rand(3))
    assert expected[:2] == again[:2] and torch.equal(expected[2], again[2])


def test_best_k_keeps_the_k_best_and_last(tmp_path: Path) -> None:
    saver = ckpt_io.CheckpointSaver(tmp_path, "top1", keep_best=2, higher_is_better=True)
    best: list = []
    for epoch, top1 in enumerate([10.0, 30.0, 20.0, 5.0, 40.0]):
        best, name, dropped = saver.best_k_update(best, epoch * 10, {"top1": top1})  # what Trainer does
        saver.write({"epoch": epoch, "step": epoch * 10, "best": best}, name, dropped)
    files = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert "last.pt" in files
    assert [v for v, _ in best] == [40.0, 30.0]
    assert sorted(f for f in files if f.startswith("best")) == sorted(name for _, name in best)
    assert ckpt_io.load_checkpoint(tmp_path / "checkpoints" / "last.pt")["best"] == best
    # A falling metric ranks the other way round, and a save without metrics only rewrites last.pt.
    low = ckpt_io.CheckpointSaver(tmp_path / "low", "loss", keep_best=1, higher_is_better=False)
    ranked, name, dropped = low.best_k_update([[2.0, "a.pt"]], 7, {"loss": 1.5})
    assert ranked == [[1.5, name]] and dropped == ["a.pt"] and name.startswith("best_step0000007_loss1.5000")
    assert low.best_k_update(ranked, 8, {}) == (ranked, None, [])


def test_syncbn_checkpoint_loads_into_bn_and_back() -> None:
    torch.manual_seed(0)
    sync = build_model(ModelConfig(name="resnet20"), NormConfig(name="syncbn"), num_classes=8)
    sync.train()
    sync(torch.randn(8, 3, 16, 16))  # one process: plain BN maths; moves the running stats
    plain = build_model(ModelConfig(name="resnet20"), NormConfig(name="bn"), num_classes=8)
    plain.load_state_dict(sync.state_dict(), strict=True)
    x = torch.randn(4, 3, 16, 16)
    sync.eval(), plain.eval()
    assert torch.allclose(sync(x), plain(x), atol=1e-5)  # eval mode: same running statistics
    back = build_model(ModelConfig(name="resnet20"), NormConfig(name="syncbn"), num_classes=8)
    back.load_state_dict(plain.state_dict(), strict=True)
    back.eval()
    assert torch.equal(back(x), sync(x))
