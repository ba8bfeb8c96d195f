"""src/process_group.py: forming the group on real stores and processes over loopback (never mocks):
restarts on a shared store, the init timeout that names who is missing, lone SLURM tasks."""
from __future__ import annotations

import datetime
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as torch_dist

from src import comm, process_group

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- forming the process group: restarts on a shared store, init timeout ------------------------------

# Stands in for one worker that torchrun starts: the environment torchrun gives it (with its agent
# serving the store), then init and one all_reduce that proves the group works. Prints one line.
_LAUNCHED_WORKER = r"""
import os, sys, time
import torch
from src import comm, process_group
start = time.monotonic()
try:
    process_group.init_distributed(torch.device("cpu"), timeout_s=60, init_timeout_s=float(sys.argv[1]))
    t = torch.tensor([float(comm.get_rank() + 1)])
    comm.all_reduce(t)
    print("SUM", t.item(), flush=True)
    process_group.destroy()
except process_group.ProcessGroupInitError as err:
    print(f"INITERROR after {time.monotonic() - start:.1f} s: {err}", flush=True)
    sys.exit(3)
"""


def _launch_rank(rank: int, world: int, port: int, init_timeout_s: float, agent_store: bool) -> "subprocess.Popen":
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "SLURM_"))}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
               LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), OMP_NUM_THREADS="1",
               TORCHELASTIC_USE_AGENT_STORE=str(agent_store))
    return subprocess.Popen([sys.executable, "-c", _LAUNCHED_WORKER, str(init_timeout_s)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(procs: list["subprocess.Popen"], timeout: float = 120) -> list[tuple[int, str]]:
    out = []
    for p in procs:
        try:
            text, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            text, _ = p.communicate()
            raise AssertionError(f"a rank hung past {timeout} s:\n{text[-3000:]}") from None
        out.append((p.returncode, text))
    return out


def _agent_store() -> "torch_dist.TCPStore":
    """A store served by this test process, as torchrun's agent serves one for the whole job."""
    return torch_dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=60), wait_for_workers=False,
                               multi_tenant=True)


def test_restarted_workers_form_a_fresh_group_on_the_agents_store() -> None:
    # torchrun keeps its store across restarts and hands it to the restarted workers as it is, with the
    # keys the previous workers wrote there. Two launches of 3 ranks on one store: in the second, ranks
    # 1 and 2 start first and read the first launch's round before rank 0 publishes a new one.
    store = _agent_store()
    world = 3
    first = _finish([_launch_rank(r, world, store.port, 60, agent_store=True) for r in range(world)])
    assert all(rc == 0 and "SUM 6.0" in text for rc, text in first), first

    second = [_launch_rank(r, world, store.port, 60, agent_store=True) for r in (1, 2)]
    time.sleep(3)
    second.insert(0, _launch_rank(0, world, store.port, 60, agent_store=True))
    results = _finish(second)
    assert all(rc == 0 and "SUM 6.0" in text for rc, text in results), results


INIT_TIMEOUT_S = 4


def test_ranks_that_cannot_form_a_group_fail_within_the_init_timeout() -> None:
    store = _agent_store()
    procs = [_launch_rank(r, 4, store.port, INIT_TIMEOUT_S, agent_store=True) for r in (0, 2)]  # 1, 3 never start
    procs.append(_launch_rank(1, 2, _free_port(), INIT_TIMEOUT_S, agent_store=False))  # no rank 0 to serve a store
    (rc0, out0), (rc2, out2), (rc_alone, out_alone) = _finish(procs)

    assert rc0 == 3 and "rank 0: rank(s) 1, 3 of 4 did not join" in out0, out0
    assert f"trainer.dist_init_timeout_s={INIT_TIMEOUT_S} s" in out0, out0
    assert rc2 == 3 and "rank 2: rank 0 did not admit this rank" in out2, out2
    for text in (out0, out2):
        waited = float(text.split("INITERROR after ")[1].split(" s")[0])
        # Not before the timeout, and not much later (slack: a loaded 2-core machine).
        assert INIT_TIMEOUT_S - 0.5 <= waited <= INIT_TIMEOUT_S + 20, text
    assert rc_alone == 3 and "could not reach the store that rank 0 serves at 127.0.0.1:" in out_alone, out_alone


def test_ranks_are_printed_as_ranges() -> None:
    assert process_group._ranges([1, 2, 3, 7, 9, 10]) == "1-3, 7, 9-10"
    assert process_group._ranges([5]) == "5"


def test_lone_slurm_tasks_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # `srun --ntasks=4 python train.py` (or submitit with tasks_per_node=4): no torchrun variables.
    for var in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "4")
    with pytest.raises(process_group.ProcessGroupInitError, match="one of 4 SLURM tasks"):
        process_group.init_distributed(torch.device("cpu"), timeout_s=60, init_timeout_s=60)
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "1")  # one task per job: a plain one-process run
    process_group.init_distributed(torch.device("cpu"), timeout_s=60, init_timeout_s=60)
    assert not comm.is_initialized()
