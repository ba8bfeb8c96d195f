"""Fault tolerance with real processes: a stalled rank becomes a timeout error; a checkpoint write cut
short never corrupts the last one. (Killed workers that torchrun restarts: test_restarts.py.)"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster.torchrun_harness import (
    REPO, TINY_JOB, Job, is_alive, job_env, launch_torchrun, load_last_checkpoint, wait_until, worker_pids,
)

STALL_TIMEOUT_S = 20


@pytest.mark.slow
def test_stalled_rank_becomes_timeout_error(tmp_path: Path, jobs: list[Job], syncbn_kernels: None) -> None:
    run_dir = tmp_path / "run"
    overrides = [*TINY_JOB, "trainer.epochs=1000", f"trainer.dist_timeout_s={STALL_TIMEOUT_S}",
                 f"hydra.run.dir={run_dir}"]
    job = launch_torchrun(["--standalone", "--nproc_per_node=2", "--max-restarts=0"], overrides,
                          tmp_path / "torchrun.log")
    jobs.append(job)
    metrics = run_dir / "metrics.jsonl"
    wait_until(lambda: metrics.is_file() and metrics.stat().st_size > 0, 600, "the first train step", job)
    workers = worker_pids(job.pid)
    assert sorted(workers) == [0, 1], workers

    since = job.output_size()
    os.kill(workers[1], signal.SIGSTOP)  # rank 1 stops answering collectives, without dying
    stopped_at = time.monotonic()
    try:
        wait_until(lambda: not is_alive(workers[0]), STALL_TIMEOUT_S + 120, "rank 0 to give up", job)
        waited = time.monotonic() - stopped_at
    finally:
        os.kill(workers[1], signal.SIGCONT)  # lets torchrun's SIGTERM end it instead of its 30 s SIGKILL grace
    rc = job.wait(timeout=120)
    error = job.output(since)

    assert rc != 0, "torchrun must fail when a rank hits the collective timeout"
    # Rank 0 waits for the configured timeout, not less (then it would not be the timeout that
    # fired) and not much more (slack: gloo's detection, the traceback, a loaded 2-core machine).
    assert STALL_TIMEOUT_S - 2 <= waited <= STALL_TIMEOUT_S + 60, f"rank 0 exited {waited:.1f} s after the stall"
    assert any(word in error.lower() for word in ("timed out", "timeout")), (
        "the error should say that a collective timed out:\n" + error[-4000:])
    assert f"trainer.dist_timeout_s={STALL_TIMEOUT_S} s" in error, (
        "the error should name the setting that decides the timeout:\n" + error[-4000:])


# --- atomic checkpoint writes ---------------------------------------------------------------------

# Writes checkpoints as fast as it can through the trainer's own saver, step after step; each one
# carries a payload whose every element equals its step, so a torn or mixed file cannot pass.
_WRITER = r"""
import sys
from pathlib import Path
import torch
from src.engine.checkpoint.files import CheckpointSaver
saver = CheckpointSaver(Path(sys.argv[1]), "top1", 0, higher_is_better=True)
numel = int(sys.argv[2])
step = 0
while True:
    step += 1
    saver.write({"step": step, "model": {"w": torch.full((numel,), float(step))}})
    print(step, flush=True)
"""
_PAYLOAD_NUMEL = 16 * 2**20  # 64 MiB of float32: the write takes long enough to be caught in the middle


@pytest.mark.slow
def test_checkpoint_killed_mid_write_leaves_previous_loadable(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    ckpt_dir = run_dir / "checkpoints"
    mid_write_kills = 0
    for attempt in range(12):
        writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(run_dir), str(_PAYLOAD_NUMEL)], cwd=REPO,
                                  env=job_env(), stdout=subprocess.PIPE, text=True, start_new_session=True)
        try:
            assert writer.stdout is not None
            first = writer.stdout.readline()
            assert first.strip().isdigit(), f"the writer failed before its first checkpoint (exit {writer.poll()})"
            # Kill while the next checkpoint is being written: its temporary file exists and grows.
            wait_until(lambda: any(p.name.startswith(".") and p.stat().st_size > 0 for p in ckpt_dir.iterdir()),
                       60, "the next checkpoint write", poll=0.001)
            os.killpg(writer.pid, signal.SIGKILL)
            writer.wait(timeout=30)
            printed = [int(line) for line in [first, *writer.stdout.read().split()] if str(line).strip()]
        finally:
            if writer.poll() is None:
                os.killpg(writer.pid, signal.SIGKILL)
                writer.wait(timeout=30)
        leftovers = [p for p in ckpt_dir.iterdir() if p.name.startswith(".")]
        mid_write_kills += bool(leftovers)
        for leftover in leftovers:  # what a crash leaves behind: a partial temporary file, never last.pt
            leftover.unlink()

        state = load_last_checkpoint(run_dir)  # must load, whatever moment the kill hit
        step = int(state["step"])
        assert step >= max(printed), f"attempt {attempt}: last.pt holds step {step}, older than a finished save"
        w = state["model"]["w"]
        assert w.numel() == _PAYLOAD_NUMEL and bool((w == float(step)).all()), f"attempt {attempt}: torn checkpoint"
        if mid_write_kills >= 3:
            break
    assert mid_write_kills >= 3, f"only {mid_write_kills} kill(s) landed during a write: the test proved too little"
