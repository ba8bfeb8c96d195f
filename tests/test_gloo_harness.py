"""tests/support/gloo.py itself: results in rank order, workers reused without leaking state, a fresh pool after
a rank raised, died or timed out in a collective, groups formed as a training run forms them, and a worker that
crashes outside a task reported with the tests that ran on it."""
from __future__ import annotations

import atexit
import os
import signal

import pytest
import torch
import torch.distributed as dist

from src.syncbn import collectives, create_rank_groups, create_stats_group
from src.syncbn.groups import rank_group, stats_group
from tests.support import gloo
from tests.support.gloo import RankFailure, run_on_ranks

WORLD = 2


def _echo(rank: int, world: int, scale: float, x: torch.Tensor) -> dict:
    total = x * scale * (rank + 1)
    dist.all_reduce(total)
    return {"rank": rank, "world": world, "pid": os.getpid(), "total": total, "group_size": dist.get_world_size()}


def test_results_come_back_in_rank_order_by_value() -> None:
    results = run_on_ranks(WORLD, _echo, 2.0, torch.ones(3))
    assert [r["rank"] for r in results] == [0, 1] and {r["world"] for r in results} == {2}
    assert all(r["group_size"] == 2 for r in results)
    for r in results:
        torch.testing.assert_close(r["total"], torch.full((3,), 6.0))  # 2 * (1 + 2)


def _leave_state_behind(rank: int, world: int) -> tuple[int, int]:
    start = (os.getpid(), torch.initial_seed())
    create_stats_group()
    create_rank_groups(1)
    dist.new_group([0, 1])
    torch.manual_seed(1234)
    torch.set_num_threads(2)
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    os.environ["SYNCTRAIN_TEST_LEAK"] = "1"
    collectives.call_counts["all_gather"] += 5
    return start


def _look_for_state(rank: int, world: int) -> dict:
    try:
        rank_group(1)
        cached_rank_group = True
    except RuntimeError:
        cached_rank_group = False
    return {
        "pid": os.getpid(), "stats_group": stats_group(), "cached_rank_group": cached_rank_group,
        "seed": torch.initial_seed(), "threads": torch.get_num_threads(), "dtype": torch.get_default_dtype(),
        "grad": torch.is_grad_enabled(), "env": os.environ.get("SYNCTRAIN_TEST_LEAK"),
        "counts": dict(collectives.call_counts), "local_rank": os.environ["LOCAL_RANK"],
    }


def test_a_reused_worker_starts_each_task_fresh() -> None:
    first = run_on_ranks(WORLD, _leave_state_behind)
    seen = run_on_ranks(WORLD, _look_for_state)
    assert [s["pid"] for s in seen] == [pid for pid, _ in first]  # the same processes ran both tasks
    for rank, s in enumerate(seen):
        assert s["stats_group"] is None and not s["cached_rank_group"]
        assert s["seed"] == first[rank][1] != 1234  # the seed this worker started with
        assert (s["threads"], s["dtype"], s["grad"], s["env"]) == (1, torch.float32, True, None)
        assert s["counts"] == {"all_gather": 0, "all_reduce": 0, "received": 0}
        assert s["local_rank"] == str(rank)


def _pid(rank: int, world: int) -> int:
    return os.getpid()


def _rank_1_raises(rank: int, world: int) -> None:
    if rank == 1:
        raise ValueError("rank one is broken")
    dist.barrier()  # rank 0 waits in a collective that rank 1 never joins


def _rank_1_dies(rank: int, world: int) -> None:
    if rank == 1:
        os._exit(3)
    dist.barrier()


def _rank_1_skips_a_collective(rank: int, world: int) -> str:
    if rank == 0:
        dist.all_reduce(torch.ones(1))
    return "skipped"


def test_a_raising_rank_is_reported_and_the_pool_restarts() -> None:
    before = run_on_ranks(WORLD, _pid)
    with pytest.raises(RankFailure, match="rank one is broken") as info:
        run_on_ranks(WORLD, _rank_1_raises)
    assert "ValueError: rank one is broken" in info.value.errors[1]
    after = run_on_ranks(WORLD, _pid)
    assert not set(before) & set(after)


def test_a_dying_rank_is_reported_and_the_pool_restarts() -> None:
    before = run_on_ranks(WORLD, _pid)
    with pytest.raises(RankFailure) as info:
        run_on_ranks(WORLD, _rank_1_dies)
    assert "the worker died (exit code 3)" in info.value.errors[1]
    after = run_on_ranks(WORLD, _pid)
    assert not set(before) & set(after)


def test_a_collective_timeout_fails_the_waiting_rank_and_the_pool_restarts() -> None:
    before = run_on_ranks(WORLD, _pid)
    with pytest.raises(RankFailure) as info:
        run_on_ranks(WORLD, _rank_1_skips_a_collective, timeout_s=3)
    assert "timed out" in info.value.errors[0].lower() or "timeout" in info.value.errors[0].lower()
    assert info.value.results == {1: "skipped"}
    after = run_on_ranks(WORLD, _pid)
    assert not set(before) & set(after)


def test_a_fresh_pool_is_not_shared() -> None:
    shared = run_on_ranks(1, _pid)  # one rank: starting it costs half of two
    fresh = run_on_ranks(1, _pid, fresh=True)
    assert not set(shared) & set(fresh)
    assert run_on_ranks(1, _pid) == shared


def test_pools_over_the_worker_cap_stop_the_least_recently_used(monkeypatch: pytest.MonkeyPatch) -> None:
    gloo.close_all()
    monkeypatch.setattr(gloo, "MAX_WORKERS", 2)
    one = run_on_ranks(1, _pid)
    run_on_ranks(2, _pid)  # 1 + 2 workers > 2: the one-rank pool stops first
    assert list(gloo._POOLS) == [2]
    assert run_on_ranks(1, _pid) != one  # started again, and the two-rank pool stopped for it
    assert list(gloo._POOLS) == [1]


def _crash_at_exit(rank: int, world: int, how: str) -> int:
    if rank == 1 and how == "status":  # after this task's result is sent: when the worker's interpreter shuts down
        atexit.register(os._exit, 5)
    elif rank == 1:
        atexit.register(os.kill, os.getpid(), signal.SIGSEGV)
    return os.getpid()


@pytest.mark.parametrize("how,said", [("status", "exited with status 5"), ("signal", "exited with signal SIGSEGV")])
def test_a_worker_that_crashes_at_exit_fails_the_tests_that_ran_on_it(how: str, said: str) -> None:
    with pytest.raises(gloo.WorkerCrash, match=rf"rank 1 \(pid \d+\) {said}\. Tests that ran on these workers: "
                                               rf"tests/test_gloo_harness.py::test_a_worker_that_crashes_at_exit"):
        run_on_ranks(WORLD, _crash_at_exit, how, fresh=True)


def test_a_shared_worker_that_crashes_is_reported_when_its_pool_closes(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not gloo.close_all()  # the pools the tests before used exited cleanly
    run_on_ranks(WORLD, _pid)
    run_on_ranks(WORLD, _crash_at_exit, "status")
    (report,) = gloo.close_all()  # as at the session's end (tests/conftest.py fails the run with it)
    assert "rank 1" in report and "exited with status 5" in report
    # the test's node id; under `--dist loadgroup` pytest-xdist appends "@<group>"
    assert report.split("@")[0].endswith("test_a_shared_worker_that_crashes_is_reported_when_its_pool_closes")
    # Evicted to make room for another pool: the test that needs the room fails, naming the ones that ran there.
    monkeypatch.setattr(gloo, "MAX_WORKERS", 2)
    run_on_ranks(WORLD, _crash_at_exit, "status")
    with pytest.raises(gloo.WorkerCrash, match="exited with status 5"):
        run_on_ranks(1, _pid)


def _group_facts(rank: int, world: int) -> dict:
    return {"backend": dist.get_backend(), "agent_store": os.environ.get("TORCHELASTIC_USE_AGENT_STORE")}


def test_tasks_form_their_group_through_init_distributed() -> None:
    facts = run_on_ranks(WORLD, _group_facts)
    assert facts == [{"backend": "gloo", "agent_store": "True"}] * WORLD
    # init_distributed's launch handshake: rank 0 opened a namespace of its own in the pool's store.
    assert gloo._POOLS[WORLD].store.check(["synctrain/pg/round"])
