"""scripts/slurm/train.sbatch run by a real SLURM (the local one-node cluster of the `slurm` fixture):
a job that trains to the end, and a job that is told to stop (SIGUSR1, as `--signal=B:USR1@120` sends
before a time limit), requeues itself and resumes from its checkpoint instead of starting over."""
from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.conftest import STEPS, job_overrides
from tests.cluster.slurm_cluster import LocalSlurm
from tests.cluster.torchrun_harness import (
    LOSS_RTOL, PARAM_ATOL,
    REPO, TINY_JOB, free_port, job_env, last_checkpoint_file, load_last_checkpoint, read_metrics, state_dict_max_diff,
    wait_until,
)

SBATCH = REPO / "scripts" / "slurm" / "train.sbatch"

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _submit(slurm: LocalSlurm, tmp_path: Path, run_dir: Path, overrides: list[str]) -> str:
    """sbatch the script as a user would, on this 2-CPU node: 1 node, 2 CPU workers, no GPUs."""
    env = {**job_env(), "SLURM_CONF": str(slurm.conf), "GPUS_PER_NODE": "2", "RDZV_PORT": str(free_port()),
           "RUN_DIR": str(run_dir), "SHUTDOWN_TIMEOUT": "60"}
    argv = ["sbatch", "--parsable", "--nodes=1", "--gpus-per-node=0", "--cpus-per-task=2",
            f"--output={tmp_path}/slurm-%j.out", str(SBATCH), *overrides]
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"sbatch failed: {proc.stderr}"
    return proc.stdout.strip().split(";")[0]


def test_sbatch_job_trains_to_the_end(slurm: LocalSlurm, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    job = _submit(slurm, tmp_path, run_dir, job_overrides(run_dir, "trainer.max_steps=8"))
    info = slurm.wait_for(job, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"), timeout=300)
    out = Path(info["StdOut"]).read_text()
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{out[-6000:]}"
    assert f"train.sbatch: job {job} on 1 node(s)" in out
    assert int(load_last_checkpoint(run_dir)["step"]) == 8
    assert [r["step"] for r in read_metrics(run_dir)] == list(range(1, 9))
    assert read_metrics(run_dir, "val"), "the job ends with an evaluation"


def test_signalled_job_requeues_itself_and_resumes_from_its_checkpoint(slurm: LocalSlurm, reference_run: Path,
                                                                       tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    job = _submit(slurm, tmp_path, run_dir, job_overrides(run_dir))
    wait_until(lambda: last_checkpoint_file(run_dir) is not None, 300, "the job's first checkpoint", poll=0.05)
    # What `--signal=B:USR1@120` does 120 s before the time limit (and how a user asks for it by hand).
    slurm.run(["scancel", "--batch", "--signal=USR1", job])
    # SLURM holds a requeued job for cred_expire (10 s here) before it runs it again.
    info = slurm.wait_for(job, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"), timeout=600)
    out = Path(info["StdOut"]).read_text()  # the requeued run's output (the file is rewritten)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{out[-6000:]}"
    assert info["Restarts"] == "1", f"the job should have been requeued once: {info}"

    # Resumed instead of starting over: step 1 logged once, every step once, the uninterrupted losses.
    rows = read_metrics(run_dir)
    steps = [r["step"] for r in rows]
    assert sorted(steps) == list(range(1, STEPS + 1)), f"steps lost or repeated across the requeue: {steps}"
    assert steps == sorted(steps), f"a step was logged again after the requeue: {steps}"
    assert f"resumed from {run_dir}" in (run_dir / "logs" / "rank0.log").read_text(), (
        "the requeued job did not resume from the checkpoint")
    ref_loss = {r["step"]: r["loss"] for r in read_metrics(reference_run)}
    for row in rows:
        assert math.isclose(row["loss"], ref_loss[row["step"]], rel_tol=LOSS_RTOL), row
    final = load_last_checkpoint(run_dir)
    assert int(final["step"]) == STEPS
    diff, key = state_dict_max_diff(final["model"], load_last_checkpoint(reference_run)["model"])
    assert diff <= PARAM_ATOL, f"requeued run ends {diff:.3g} away from the uninterrupted run at {key}"


def test_submitit_launcher_runs_a_sweep(slurm: LocalSlurm, tmp_path: Path) -> None:
    # Hydra's submitit launcher submits one SLURM job per point of the sweep (one process each) and waits.
    sweep = tmp_path / "sweep"
    argv = [sys.executable, "train.py", "-m", "hydra/launcher=submitit_slurm", "hydra.launcher.partition=debug",
            "hydra.launcher.nodes=1", "hydra.launcher.tasks_per_node=1", "hydra.launcher.cpus_per_task=1",
            "hydra.launcher.mem_gb=null", "hydra.launcher.timeout_min=10", f"hydra.sweep.dir={sweep}",
            *[o for o in TINY_JOB if not o.startswith("seed=")], "data.train_size=128", "data.val_size=32",
            "trainer.max_steps=4", "seed=0,1"]
    proc = subprocess.run(argv, cwd=REPO, env={**job_env(), "SLURM_CONF": str(slurm.conf)}, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    for job, seed in ((0, 0), (1, 1)):
        final = load_last_checkpoint(sweep / str(job))
        assert int(final["step"]) == 4 and final["config"]["seed"] == seed, (job, final["step"], final["config"]["seed"])
