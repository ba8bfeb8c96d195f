"""Fault tolerance with real processes: a killed worker is restarted and the run resumes exactly; a
stalled rank becomes a timeout error; a checkpoint write cut short never corrupts the last one."""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster.conftest import CHECKPOINT_EVERY, STEPS, job_overrides
from tests.cluster.torchrun_harness import (
    LAUNCHER, NORM, REPO, TINY_JOB, TORCHRUN, Job, free_port, is_alive, job_env, last_checkpoint_file,
    launch_torchrun, load_last_checkpoint, read_metrics, state_dict_max_diff, wait_until, worker_pids,
)

# A resumed run restores bit-identical state (fp32 tensors saved as they are, optimizer and
# scheduler state, RNG states per rank, the sampler's micro-batch position) and then repeats the
# uninterrupted run's arithmetic in the same order, so it should match to the bit. The tolerance
# only admits last-bit noise; a resume that skips or repeats a batch, or restarts the schedule or
# the momentum, moves parameters by orders of magnitude more.
PARAM_ATOL = 1e-5
LOSS_RTOL = 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("killed_rank", [1, 0], ids=["kill-rank1", "kill-rank0-the-writer"])
def test_killed_worker_restarts_and_resumes_exactly(killed_rank: int, reference_run: Path, tmp_path: Path,
                                                    jobs: list[Job]) -> None:
    run_dir = tmp_path / "run"
    # Through the documented launcher (one node here): besides the torchrun options it sets
    # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, without which torch 2.14's restarted workers cannot
    # create their process group (docs/clusters.md, section 4).
    port = free_port()
    env = job_env(NNODES="1", NPROC_PER_NODE="2", RDZV_ENDPOINT=f"127.0.0.1:{port}", RDZV_ID=f"kill-{port}",
                  MAX_RESTARTS="1", TORCHRUN=TORCHRUN)
    job = Job([str(LAUNCHER), *job_overrides(run_dir)], tmp_path / "torchrun.log", env)
    jobs.append(job)

    # Kill as soon as the first mid-epoch checkpoint exists, well before the last step.
    wait_until(lambda: last_checkpoint_file(run_dir) is not None, 600, "the first checkpoint", job, poll=0.02)
    workers = worker_pids(job.pid)
    assert sorted(workers) == [0, 1], f"expected ranks 0 and 1 under torchrun, found {workers}"
    try:
        os.kill(workers[killed_rank], signal.SIGKILL)
    except ProcessLookupError:
        pytest.fail(f"rank {killed_rank} had already exited when it was to be killed:\n{job.output()[-4000:]}")

    rc = job.wait(timeout=600)
    out = job.output()
    assert rc == 0, f"the restarted job failed (exit {rc}):\n{out[-6000:]}"
    # torchrun's agent (LOGLEVEL=INFO) says when it restarts the worker group.
    assert "will restart worker group" in out, "torchrun did not restart the workers:\n" + out[-4000:]

    final = load_last_checkpoint(run_dir)
    assert int(final["step"]) == STEPS

    # metrics.jsonl tells where training resumed: rank 0 logged every step before the kill, and the
    # restarted job logs again from the checkpoint's step + 1. Resuming from scratch would log
    # step 1 twice; a lost sampler position would change the losses of the steps after the resume.
    rows = read_metrics(run_dir)
    steps = [r["step"] for r in rows]
    assert steps.count(1) == 1, f"the restarted job started again from step 1: {steps}"
    assert set(steps) == set(range(1, STEPS + 1)), f"steps missing from metrics.jsonl: {steps}"
    restarts = [i for i in range(1, len(steps)) if steps[i] <= steps[i - 1]]
    assert len(restarts) <= 1, steps
    if restarts:
        resumed_from = steps[restarts[0]] - 1
        assert resumed_from % CHECKPOINT_EVERY == 0 or resumed_from % 8 == 0, (
            f"resumed after step {resumed_from}, which is no checkpoint step: {steps}")
    ref_loss = {r["step"]: r["loss"] for r in read_metrics(reference_run)}
    for row in rows:
        assert math.isclose(row["loss"], ref_loss[row["step"]], rel_tol=LOSS_RTOL), (
            f"step {row['step']}: loss {row['loss']} vs {ref_loss[row['step']]} without the kill")

    ours, ref = final["model"], load_last_checkpoint(reference_run)["model"]
    if NORM == "bn":
        # Per-rank BatchNorm: a checkpoint holds rank 0's running statistics only, so after a resume
        # from a mid-epoch checkpoint rank 1's differ until the next evaluation syncs them. Only the
        # parameters can match then. SyncBN (the default here) keeps them identical on all ranks.
        ours, ref = ({k: v for k, v in sd.items() if "running_" not in k} for sd in (ours, ref))
    diff, key = state_dict_max_diff(ours, ref)
    assert diff <= PARAM_ATOL, f"killed+resumed run ends {diff:.3g} away from the uninterrupted run at {key}"


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
from src.engine.checkpoint import CheckpointSaver
saver = CheckpointSaver(Path(sys.argv[1]), "top1", 0)
numel = int(sys.argv[2])
step = 0
while True:
    step += 1
    saver.save_last({"step": step, "model": {"w": torch.full((numel,), float(step))}})
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
