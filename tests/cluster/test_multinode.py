"""Two torchrun "nodes" on one machine train together and reproduce a one-node run.

The nodes are started the way a user starts them on a cluster, with scripts/launch_multinode.sh
(c10d rendezvous, here on 127.0.0.1), one worker each; the reference is one node with
--nproc_per_node=2. Same total world size, same deterministic job: the per-step losses, the
validation metrics and the final parameters must agree.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.cluster.conftest import STEPS, job_overrides
from tests.cluster.torchrun_harness import (
    LOSS_RTOL, PARAM_ATOL,
    LAUNCHER, TORCHRUN, Job, free_port, job_env, load_last_checkpoint, read_metrics, state_dict_max_diff,
)



@pytest.mark.slow
def test_two_nodes_match_one_node(reference_run: Path, tmp_path: Path, jobs: list[Job]) -> None:
    run_dir = tmp_path / "run"
    port = free_port()
    env = job_env(NNODES="2", NPROC_PER_NODE="1", RDZV_ENDPOINT=f"127.0.0.1:{port}",
                  RDZV_ID=f"two-nodes-{port}", MAX_RESTARTS="0", TORCHRUN=TORCHRUN)
    for node in range(2):
        jobs.append(Job([str(LAUNCHER), *job_overrides(run_dir)], tmp_path / f"node{node}.log", env))
    for node, job in enumerate(jobs):
        rc = job.wait(timeout=600)
        assert rc == 0, f"node {node} failed:\n" + job.output()[-6000:]
        # torchrun's agent logs its rendezvous result: both agents must be in one 2-node group.
        assert "group_world_size=2" in job.output(), f"node {node} did not join a 2-node job:\n{job.output()[-3000:]}"

    ours, ref = load_last_checkpoint(run_dir), load_last_checkpoint(reference_run)
    assert int(ours["step"]) == STEPS

    ref_loss = {r["step"]: r["loss"] for r in read_metrics(reference_run)}
    our_loss = {r["step"]: r["loss"] for r in read_metrics(run_dir)}
    assert sorted(our_loss) == list(range(1, STEPS + 1))
    for step, loss in ref_loss.items():
        assert math.isclose(our_loss[step], loss, rel_tol=LOSS_RTOL), (
            f"step {step}: loss {our_loss[step]} on two nodes vs {loss} on one node")

    ours_val, ref_val = read_metrics(run_dir, "val"), read_metrics(reference_run, "val")
    assert [r["step"] for r in ours_val] == [r["step"] for r in ref_val]
    for key in ("loss", "top1"):
        assert [r[key] for r in ours_val] == pytest.approx([r[key] for r in ref_val], rel=LOSS_RTOL), key

    diff, key = state_dict_max_diff(ours["model"], ref["model"])
    assert diff <= PARAM_ATOL, f"final parameters differ by {diff:.3g} at {key}"
