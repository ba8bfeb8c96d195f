"""Preemption on CPU with real torchrun jobs: a stop signal ends the run after the current optimizer step
with last.pt written and exit code 75 on every worker; the same command again (trainer.resume=auto)
ends with the parameters of a run that was never interrupted."""
from __future__ import annotations

import math
import os
import re
import signal
from pathlib import Path

import pytest

from src.engine.preemption import EXIT_PREEMPTED
from tests.cluster.conftest import STEPS, job_overrides
from tests.cluster.torchrun_harness import (
    LOSS_RTOL, PARAM_ATOL,
    LAUNCHER, NORM, REPO, TORCHRUN, Job, free_port, job_env, last_checkpoint_file, launch_torchrun,
    load_last_checkpoint, read_metrics, state_dict_max_diff, wait_until,
)



def _assert_reproduces(run_dir: Path, reference_run: Path) -> None:
    """Every step logged once with the uninterrupted run's loss, and its final parameters."""
    rows = read_metrics(run_dir)
    steps = [r["step"] for r in rows]
    assert steps == list(range(1, STEPS + 1)), f"steps lost or repeated across the stop: {steps}"
    ref_loss = {r["step"]: r["loss"] for r in read_metrics(reference_run)}
    for row in rows:
        assert math.isclose(row["loss"], ref_loss[row["step"]], rel_tol=LOSS_RTOL), (
            f"step {row['step']}: loss {row['loss']} vs {ref_loss[row['step']]} without the stop")
    final, ref = load_last_checkpoint(run_dir), load_last_checkpoint(reference_run)
    assert int(final["step"]) == STEPS
    ours, theirs = final["model"], ref["model"]
    if NORM == "bn":  # per-rank BN: rank 1's running statistics are not in a mid-epoch checkpoint
        ours, theirs = ({k: v for k, v in sd.items() if "running_" not in k} for sd in (ours, theirs))
    diff, key = state_dict_max_diff(ours, theirs)
    assert diff <= PARAM_ATOL, f"stopped+resumed run ends {diff:.3g} away from the uninterrupted run at {key}"


def _launcher_job(run_dir: Path, log: Path) -> Job:
    """One node, 2 workers, through scripts/launch_multinode.sh (as the SLURM script runs it)."""
    port = free_port()
    env = job_env(NNODES="1", NPROC_PER_NODE="2", RDZV_ENDPOINT=f"127.0.0.1:{port}", RDZV_ID=f"preempt-{port}",
                  MAX_RESTARTS="1", TORCHRUN=TORCHRUN, SHUTDOWN_TIMEOUT="120")
    return Job([str(LAUNCHER), *job_overrides(run_dir)], log, env)


@pytest.mark.slow
def test_signalled_job_saves_exits_75_and_resumes_exactly(reference_run: Path, tmp_path: Path,
                                                          jobs: list[Job]) -> None:
    run_dir = tmp_path / "run"
    job = _launcher_job(run_dir, tmp_path / "first.log")
    jobs.append(job)
    wait_until(lambda: last_checkpoint_file(run_dir) is not None, 600, "the first checkpoint", job, poll=0.02)
    # What SLURM's --signal=USR1 and `docker stop` (SIGTERM) do: signal torchrun, which passes it on.
    os.kill(job.pid, signal.SIGUSR1)
    rc = job.wait(timeout=300)
    out = job.output()
    # torchrun, stopped by a signal itself, exits 1 without its per-worker summary (the workers' exit
    # code 75 is checked in the test below, where only the workers are signalled).
    assert rc != 0, "torchrun exits non-zero when it was stopped by a signal"
    assert "will restart worker group" not in out, "a stopped job must not be restarted by torchrun"

    stopped = load_last_checkpoint(run_dir)
    logged = [r["step"] for r in read_metrics(run_dir)]
    assert 3 <= int(stopped["step"]) < STEPS, f"stopped at step {stopped['step']}"
    assert logged == list(range(1, int(stopped["step"]) + 1)), (
        f"last.pt holds step {stopped['step']} but the steps logged were {logged}: the stop step was not saved")
    for rank in (0, 1):  # every rank stopped after the same step, the one saved
        rank_log = (run_dir / "logs" / f"rank{rank}.log").read_text()
        assert f"stopped on SIGUSR1 after optimizer step {stopped['step']};" in rank_log, rank_log[-3000:]

    again = _launcher_job(run_dir, tmp_path / "second.log")
    jobs.append(again)
    rc = again.wait(timeout=600)
    assert rc == 0, f"the resumed job failed:\n{again.output()[-6000:]}"
    assert f"at epoch {stopped['epoch']}, step {stopped['step']}" in again.output()
    _assert_reproduces(run_dir, reference_run)


# train.py with its evaluation wrapped: rank 1 (only) signals itself when the first evaluation starts.
_SIGNAL_IN_EVAL = r"""
import os, runpy, signal, sys
import src.commands.train as train
evaluate = train.evaluate
def signalling_evaluate(*args, **kwargs):
    if os.environ.get("RANK") == "1" and not getattr(signalling_evaluate, "done", False):
        signalling_evaluate.done = True
        os.kill(os.getpid(), signal.SIGUSR1)
    return evaluate(*args, **kwargs)
train.evaluate = signalling_evaluate
sys.argv[0] = "train.py"
try:
    runpy.run_path("train.py", run_name="__main__")
finally:  # threads of process groups still alive would be torn down in interpreter shutdown (it can abort there)
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
    print(f"rank {os.environ['RANK']} exits with {sum('gloo' in n for n in names)} gloo thread(s)", flush=True)
"""


@pytest.mark.slow
def test_signal_during_evaluation_on_one_rank_stops_both_after_it(reference_run: Path, tmp_path: Path,
                                                                  jobs: list[Job]) -> None:
    run_dir = tmp_path / "run"
    script = tmp_path / "train_signal_in_eval.py"
    script.write_text(_SIGNAL_IN_EVAL)
    env = job_env(PYTHONPATH=str(REPO))
    job = Job([TORCHRUN, "--standalone", "--nproc_per_node=2", "--max-restarts=0", str(script),
               *job_overrides(run_dir)], tmp_path / "first.log", env)
    jobs.append(job)
    rc = job.wait(timeout=600)
    out = job.output()
    assert rc != 0 and out.count(f"exitcode  : {EXIT_PREEMPTED}") == 2, out[-6000:]
    assert sorted(re.findall(r"rank (\d) exits with 0 gloo thread\(s\)", out)) == ["0", "1"], (
        f"the process groups' threads outlive train.py's teardown:\n{out[-6000:]}")

    # The evaluation under way finished and was logged; the epoch's checkpoint is what was kept.
    vals = read_metrics(run_dir, "val")
    stopped = load_last_checkpoint(run_dir)
    assert [v["step"] for v in vals] == [8], vals
    assert (int(stopped["step"]), int(stopped["epoch"]), int(stopped["sampler"]["micro_batch"])) == (8, 1, 0)
    assert stopped["metrics"]["top1"] == vals[0]["top1"], "the checkpoint holds the evaluated weights' metrics"

    again = launch_torchrun(["--standalone", "--nproc_per_node=2"], job_overrides(run_dir), tmp_path / "second.log")
    jobs.append(again)
    assert again.wait(timeout=600) == 0, again.output()[-6000:]
    assert [v["step"] for v in read_metrics(run_dir, "val")] == [8, 16, 24, 32], "epoch 0 evaluated once"
    _assert_reproduces(run_dir, reference_run)
