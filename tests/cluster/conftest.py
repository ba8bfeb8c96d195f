"""Fixtures shared by the torchrun tests: the compiled SyncBN kernels, job cleanup, and one
uninterrupted reference run that the multi-node and kill-and-resume runs must reproduce."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

# part: slurm
from tests.cluster.slurm_cluster import LocalSlurm, missing_requirements
# /part
from tests.cluster.torchrun_harness import (
    NORM, REPO, TINY_JOB, Job, job_env, launch_torchrun, load_last_checkpoint,
)

# The reference job: 4 epochs of 8 optimizer steps. Checkpoints every 3 steps fall mid-epoch
# (3, 6, 9, ...), so resuming from one exercises the exact mid-epoch position of the sampler.
STEPS = 32
CHECKPOINT_EVERY = 3


def job_overrides(run_dir: Path, *extra: str) -> list[str]:
    """The tiny deterministic job, writing to `run_dir`, resuming from it when restarted."""
    return [*TINY_JOB, f"trainer.max_steps={STEPS}", f"trainer.checkpoint_every={CHECKPOINT_EVERY}", "trainer.resume=auto",
            f"hydra.run.dir={run_dir}", *extra]


@pytest.fixture(scope="session")
def syncbn_kernels() -> None:
    """Compile (or find cached) the SyncBN kernels once, before any timed torchrun job.

    The first build takes minutes on a 2-core machine; inside a job it would count against the
    job's timeouts (and, in the stall test, against trainer.dist_timeout_s while the other rank
    waits), so it happens here, with its own generous timeout.
    """
    if NORM != "syncbn":
        return
    proc = subprocess.run(
        [sys.executable, "-c", "from src.syncbn.extension import load_extension; load_extension()"],
        cwd=REPO, env=job_env(), capture_output=True, text=True, timeout=1800,
    )
    assert proc.returncode == 0, f"building the SyncBN extension failed:\n{proc.stderr[-4000:]}"


@pytest.fixture()
def jobs() -> Iterator[list[Job]]:
    """Jobs a test starts; whatever is still running at the end is killed (its process group only)."""
    started: list[Job] = []
    yield started
    for job in started:
        job.kill()


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory: pytest.TempPathFactory, syncbn_kernels: None) -> Path:
    """One uninterrupted node with 2 processes: the run every other cluster run must reproduce."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    job = launch_torchrun(["--standalone", "--nproc_per_node=2"], job_overrides(run_dir),
                          run_dir.parent / "torchrun.log")
    try:
        rc = job.wait(timeout=600)
    finally:
        job.kill()
    assert rc == 0, "the reference run failed:\n" + job.output()[-6000:]
    assert int(load_last_checkpoint(run_dir)["step"]) == STEPS
    return run_dir


# part: slurm
@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurm]:
    """A one-machine SLURM cluster (slurmctld + slurmd on 127.0.0.1) for the session; skips where it cannot run."""
    why_not = missing_requirements()
    if why_not:
        pytest.skip(f"no local SLURM cluster: {why_not}")
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except (RuntimeError, OSError, subprocess.SubprocessError) as err:
        cluster.stop()
        pytest.skip(f"the local SLURM daemons could not start: {err}")
    yield cluster
    cluster.stop()
# /part
