"""A run folder holds one run, end to end with real torchrun jobs (2 gloo processes, float64): Ctrl-C at a random
step stops every rank with last.pt and prints the command that continues, and that command (the folder alone) ends
bit-identical to the uninterrupted run, with MixUp on so that the RNG restore matters; a refused new run and a
refused resume leave every file as it was; a start that fails its checks after the process group leaves no folder.
(The decisions themselves, in this process: tests/commands/test_start.py.)"""
from __future__ import annotations

import hashlib
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from src.engine.checkpoint.files import load_checkpoint
from src.engine.preemption import EXIT_INTERRUPTED
from tests.support.launch import REPO, TINY, _env, launch, rows

# 96 images / (2 x 8) = 6 optimizer steps per epoch, 3 epochs; GroupNorm (no running statistics: nothing a
# per-rank buffer could make differ), MixUp (its mixing weights come from the RNG a checkpoint restores).
JOB = [*TINY, "data.train_size=96", "data.val_size=16", "data.batch_size=8", "norm=gn", "trainer.epochs=3",
       "trainer.dtype=float64", "trainer.deterministic=true", "trainer.mixup_alpha=0.4", "trainer.log_every=1",
       "trainer.tensorboard=false"]
STEPS = 18


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    result = launch(2, [*JOB, f"hydra.run.dir={run_dir}"])
    assert result.returncode == 0, result.stdout[-4000:]
    return run_dir


def _interrupt_at(run_dir: Path, step: int) -> subprocess.CompletedProcess:
    """torchrun on 2 processes, Ctrl-C'd (SIGINT to its process group, as a terminal does) once `step` is logged."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            str(REPO / "train.py"), *JOB, f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen(argv, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not ((run_dir / "metrics.jsonl").is_file() and len(rows(run_dir, "train")) >= step):
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended before it was interrupted"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return subprocess.CompletedProcess(argv, proc.returncode, out, None)


def _hashes(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow  # torchrun on 2 processes, three times
def test_ctrl_c_then_the_printed_command_ends_bit_identical_to_the_uninterrupted_run(reference: Path,
                                                                                     tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    at = random.Random().randint(1, STEPS // 2)
    stopped = _interrupt_at(run_dir, at)
    out = stopped.stdout
    lines = re.findall(r"interrupted after step (\d+); checkpoint: (\S+); continue with: (.+)", out)
    assert len(lines) == 1, f"signalled at step {at}: {out[-6000:]}"
    step, checkpoint, command = int(lines[0][0]), REPO / lines[0][1], lines[0][2]
    assert at <= step < STEPS and load_checkpoint(checkpoint)["step"] == step
    assert out.count("Ctrl-C: finishing this step") == 1  # rank 0 acknowledged it, once
    # Our processes print no traceback: the only one is torchrun's own report of the signal.
    assert out.count("Traceback") == 1 and "SignalException" in out and "KeyboardInterrupt" not in out, out[-6000:]
    for rank in (0, 1):  # every rank stopped after the same step, with the interruption's exit code
        assert f"interrupted after step {step};" in (run_dir / "logs" / f"rank{rank}.log").read_text()
    assert f"exitcode  : {EXIT_INTERRUPTED}" not in out  # torchrun itself was interrupted: no failure summary
    assert [r["step"] for r in rows(run_dir, "train")] == list(range(1, step + 1))
    assert command.endswith(f"train.py trainer.resume={run_dir}") and "--nproc_per_node=2" in command

    again = subprocess.run(shlex.split(command), cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=420)
    assert again.returncode == 0, again.stdout[-4000:]
    assert f"resumed from {checkpoint}" in again.stdout

    # Every step once, each with the uninterrupted run's loss, and the same final weights and optimizer state.
    assert [(r["step"], r["loss"]) for r in rows(run_dir, "train")] == \
        [(r["step"], r["loss"]) for r in rows(reference, "train")]
    final, ref = (load_checkpoint(d / "checkpoints" / "last.pt") for d in (run_dir, reference))
    assert final["step"] == STEPS
    for key, value in ref["model"].items():
        assert value.dtype != torch.float32 and torch.equal(final["model"][key], value), key
    momentum = [(a["momentum_buffer"], b["momentum_buffer"]) for a, b in
                zip(final["optimizer"]["state"].values(), ref["optimizer"]["state"].values())]
    assert momentum and all(torch.equal(a, b) for a, b in momentum)


@pytest.mark.slow  # torchrun on 2 processes, twice
def test_a_refused_new_run_and_a_refused_resume_leave_every_file_as_it_was(reference: Path) -> None:
    before = _hashes(reference)
    new = launch(2, [*JOB, f"hydra.run.dir={reference}"])
    assert new.returncode != 0 and f"hydra.run.dir={reference} already holds a run (step {STEPS}" in new.stdout
    assert _hashes(reference) == before
    elsewhere = reference.parent / "elsewhere"
    elsewhere.mkdir()
    other_model = launch(2, [f"trainer.resume={reference}", "model=resnet32"], cwd=elsewhere)
    assert other_model.returncode != 0
    assert "model.name: 'resnet20' (the run) -> 'resnet32' (command line)" in other_model.stdout
    assert _hashes(reference) == before  # .hydra/ included: the folder still says how its checkpoints were made
    assert list(elsewhere.iterdir()) == []  # nor is the outputs/<date_time> folder Hydra made for it left there


@pytest.mark.usefixtures("restores_process_state", "one_thread")  # run() in this process
def test_a_start_that_fails_after_the_process_group_leaves_no_new_folder(trained_cls_run: Path, tmp_path: Path) -> None:
    """The checkpoint is checked after the process group, the data and the model: still before the folder is made.
    (A ResNet-20 checkpoint, a ResNet-32 model.)"""
    from hydra import compose, initialize_config_dir

    from src.commands.train import run

    new = tmp_path / "new"
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose("train", overrides=[*TINY, "model=resnet32", "norm=bn", f"hydra.run.dir={new}",
                                          f"trainer.resume={trained_cls_run / 'checkpoints' / 'last.pt'}"],
                      return_hydra_config=True)
    with pytest.raises(ValueError, match="do not fit this model"):
        run(cfg)
    assert not new.exists()
