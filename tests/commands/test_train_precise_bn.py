"""trainer.precise_bn_batches end to end: train.py's run() in this process (one process, tiny `shapes` job, ~2 s)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from src.engine.checkpoint.files import load_checkpoint
from tests.support.launch import REPO, rows

# 64 images / 16 = 4 optimizer steps per epoch, 2 epochs, an evaluation after each; EMA on.
JOB = ["data.train_size=64", "data.val_size=20", "data.image_size=16", "data.eval_batch_size=64", "data.batch_size=16",
       "device=cpu", "seed=3", "norm=bn", "trainer.num_threads=1", "trainer.progress_bar=false",
       "trainer.tensorboard=false", "trainer.epochs=2", "trainer.ema=true", "trainer.log_every=1"]


def _train(run_root: Path, monkeypatch: pytest.MonkeyPatch, overrides: list[str]) -> Path:
    from src.commands.train import run

    run_root.mkdir()
    monkeypatch.chdir(run_root)  # outside Hydra's app the run dir is outputs/<time> under the working directory
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose("train", overrides=[*JOB, *overrides])
    run(cfg)
    (run_dir,) = (run_root / "outputs").iterdir()
    return run_dir


@pytest.mark.usefixtures("restores_process_state", "one_thread")  # run() in this process
def test_recalibration_before_each_evaluation_changes_only_the_statistics(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    plain = _train(tmp_path / "plain", monkeypatch, [])
    precise = _train(tmp_path / "precise", monkeypatch, ["trainer.precise_bn_batches=3", "trainer.precise_bn_every=1"])
    log = (precise / "logs" / "rank0.log").read_text()
    assert log.count("precise BN at step") == 2, log[-3000:]  # before both evaluations
    assert "3 training batch(es) per process x 1 process(es) = 48 images; model: 19 BatchNorm layer(s) recomputed" in log
    assert "EMA: 19 BatchNorm layer(s) recomputed" in log
    # Training itself is untouched (the RNG is restored, train-mode BatchNorm never reads its running statistics).
    def losses(run_dir: Path) -> list[tuple[int, float]]:
        return [(r["step"], r["loss"]) for r in rows(run_dir, "train")]

    assert len(losses(plain)) == 8 and losses(plain) == losses(precise)
    assert [r["loss"] for r in rows(plain, "val")] != [r["loss"] for r in rows(precise, "val")]
    a, b = (load_checkpoint(d / "checkpoints" / "last.pt") for d in (plain, precise))
    for key, value in a["model"].items():
        if key.endswith(("running_mean", "running_var")):
            assert not torch.equal(value, b["model"][key]), key
        else:  # weights and num_batches_tracked
            assert torch.equal(value, b["model"][key]), key
