"""`torchrun --max-restarts` with a worker SIGKILLed mid-epoch, in each of torchrun's launch forms:
the restarted workers form their process group and resume exactly, with and without
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (no environment variable is needed; setting it must not hurt).

- static: torchrun's default rendezvous, `--master_addr/--master_port`. The store lives in the agent for
  the whole job, restarts included, and the variable does not change that.
- standalone: `--standalone`, a c10d rendezvous on localhost. The agent shares its store with the
  workers unless the variable is set (then every restart gets a fresh store served by rank 0).
- c10d-2-nodes: two agents (`--nnodes=2 --rdzv_backend=c10d`) on 127.0.0.1, one worker each. When one
  worker dies, both agents start a new rendezvous round, but only the agent whose worker failed counts
  a restart: the two workers of the new round see different TORCHELASTIC_RESTART_COUNTs.
"""
from __future__ import annotations

import math
import os
import re
import signal
from pathlib import Path

import pytest

from tests.cluster.conftest import CHECKPOINT_EVERY, STEPS, job_overrides
from tests.cluster.torchrun_harness import (
    LOSS_RTOL, PARAM_ATOL,
    NORM, Job, free_port, job_env, last_checkpoint_file, launch_torchrun, load_last_checkpoint, read_metrics,
    state_dict_max_diff, wait_until, worker_pids,
)


CASES = [  # (launch form, TORCH_DISABLE_SHARE_RDZV_TCP_STORE, killed global rank)
    ("static", None, 1), ("static", "1", 0),
    ("standalone", None, 0), ("standalone", "1", 1),
    ("c10d-2-nodes", None, 1), ("c10d-2-nodes", "1", 0),
]


def _launch(form: str, run_dir: Path, logs: Path, share_var: str | None) -> list[Job]:
    """The torchrun agent(s) of one job in launch form `form`, one restart allowed."""
    env = job_env()
    env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)
    if share_var is not None:
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = share_var
    port = free_port()
    if form == "static":
        agents = [["--nproc_per_node=2", "--master_addr=127.0.0.1", f"--master_port={port}"]]
    elif form == "standalone":
        agents = [["--standalone", "--nproc_per_node=2"]]
    else:
        rdzv = ["--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
                f"--rdzv_id=restart-{port}"]
        agents = [rdzv, rdzv]
    return [launch_torchrun([*args, "--max-restarts=1"], job_overrides(run_dir), logs / f"agent{i}.log", env)
            for i, args in enumerate(agents)]


@pytest.mark.slow
@pytest.mark.parametrize("form, share_var, killed_rank", CASES,
                         ids=[f"{f}-{'var-set' if v else 'var-unset'}-kill-rank{k}" for f, v, k in CASES])
def test_killed_worker_restarts_and_resumes_exactly(form: str, share_var: str | None, killed_rank: int,
                                                    reference_run: Path, tmp_path: Path, jobs: list[Job]) -> None:
    run_dir = tmp_path / "run"
    agents = _launch(form, run_dir, tmp_path, share_var)
    jobs.extend(agents)

    # Kill as soon as the first mid-epoch checkpoint exists, well before the last step.
    wait_until(lambda: last_checkpoint_file(run_dir) is not None, 600, "the first checkpoint", agents[0], poll=0.02)
    workers = {rank: (agent, pid) for agent in agents for rank, pid in worker_pids(agent.pid).items()}
    assert sorted(workers) == [0, 1], f"expected ranks 0 and 1 under torchrun, found {sorted(workers)}"
    killed_agent, pid = workers[killed_rank]
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pytest.fail(f"rank {killed_rank} had already exited when it was to be killed:\n{killed_agent.output()[-4000:]}")

    for agent in agents:
        rc = agent.wait(timeout=600)
        assert rc == 0, f"the restarted job failed (exit {rc}):\n{agent.output()[-6000:]}"
    # torchrun's agent (LOGLEVEL=INFO) says when it restarts the worker group.
    out = killed_agent.output()
    assert "will restart worker group" in out, "torchrun did not restart the workers:\n" + out[-4000:]

    final = load_last_checkpoint(run_dir)
    assert int(final["step"]) == STEPS

    # The restarted job resumed from a checkpoint (not from scratch), and metrics.jsonl continues from its step:
    # the rows the killed job logged after that checkpoint are gone, so every step is there once, in order. A
    # lost sampler position would change the losses of the steps after the resume.
    resumed = re.findall(r"resumed from \S+ at epoch \d+, step (\d+)", (run_dir / "logs" / "rank0.log").read_text())
    assert len(resumed) == 1 and int(resumed[0]) > 0, f"the restarted job did not resume from a checkpoint: {resumed}"
    resumed_from = int(resumed[0])
    assert resumed_from % CHECKPOINT_EVERY == 0 or resumed_from % 8 == 0, (
        f"resumed after step {resumed_from}, which is no checkpoint step")
    rows = read_metrics(run_dir)
    steps = [r["step"] for r in rows]
    assert steps == list(range(1, STEPS + 1)), f"metrics.jsonl has steps lost or twice: {steps}"
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
