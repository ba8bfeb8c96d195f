"""Run a function on W real gloo ranks over loopback, on worker processes that live for the whole session.

Starting W spawned Python processes that import torch costs seconds each on 2 shared cores, far more
than most multi-rank tests themselves, so there is one pool of W workers per world size, started on
first use and reused by every later call. Each call (a task) still runs as on fresh processes: the
workers form a new default process group for it and reset what a test may change
(tests/support/gloo_worker.py says what and how). Forming a group over the pool's store takes tens of
milliseconds.

Each task forms its group as a training run does, through src/process_group.py's init_distributed (torchrun's
environment and store, the launch handshake, the timeouts) and tears it down with its destroy().

Safety nets, so that a bug fails a test instead of hanging CI: every collective has the group's timeout
(`timeout_s`), a task has a wall-clock deadline after which its workers are killed, and a rank's
traceback comes back to the test. After any failure (a rank raised, died or missed the deadline) the
pool is discarded, so the next call gets new processes and a new group: a failed task may have left
peers inside a collective. A test that breaks the group on purpose passes `breaks_group=True`;
`fresh=True` runs on processes started for this call alone (for what only a new process gives, e.g.
environment variables read at import).

A worker that crashes outside a task (after sending its result, between tasks, or while stopping) is seen
when its pool closes (after a failure, when it is evicted, after a fresh or group-breaking call, and at the
end of the session: tests/conftest.py): every worker must have exited with status 0, or WorkerCrash names
the worker, its exit status and every test that ran a task on it.
"""
from __future__ import annotations

import atexit
import datetime
import multiprocessing as mp
import os
import pickle
import signal
import time
from collections import OrderedDict
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Optional

import torch.distributed as dist

from tests.support.gloo_worker import serve

COLLECTIVE_TIMEOUT_S = 60.0  # one collective on loopback takes milliseconds; 60 s means a lost peer
DEADLINE_S = 300.0  # one task; far above what any takes (tens of seconds on 2 busy cores)
START_TIMEOUT_S = 300.0  # importing torch in W processes at once on 2 busy cores: tens of seconds
GRACE_S = 5.0  # after a rank failed, how long the others may take to report their own errors
# A worker told to stop leaves its loop at once; the interpreter's shutdown after it takes a second or two (tens
# of seconds on an overloaded machine). One that takes longer hangs there.
STOP_TIMEOUT_S = 120.0
# Idle workers kept across tests, all pools together: each holds ~375 MB of private memory (torch, the
# kernels), and one pool per world size 1-4 would be 10 of them, in every pytest(-xdist) process. Beyond
# this, the least recently used pools are stopped (and started again if needed later).
MAX_WORKERS = int(os.environ.get("SYNCTRAIN_TEST_GLOO_MAX_WORKERS", "8"))


class RankFailure(AssertionError):
    """A rank raised, died or missed the deadline; the message holds every failing rank's traceback."""

    def __init__(self, world: int, errors: dict[int, str], results: dict[int, Any]) -> None:
        self.errors, self.results = errors, results
        text = "\n".join(f"rank {r} of {world}: {errors[r]}" for r in sorted(errors))
        super().__init__(f"multi-process run failed:\n{text}")


def _kernel_library() -> Optional[str]:
    """Build (or load) the SyncBN kernels here, under pytest's timeout, so the workers import the same file."""
    from src.syncbn.functions import KERNELS_ENV, kernel_ops

    if os.environ.get(KERNELS_ENV):
        return None  # the workers load the kernels the variable names (the emulation) themselves, at first use
    ops = kernel_ops()
    return ops.library if ops.traceable else None


class WorkerCrash(AssertionError):
    """A pool's worker did not exit cleanly; the message names it and the tests that ran tasks on it."""


class GlooPool:
    """W spawned workers that each run every task as one rank of a new gloo group."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.tests: list[str] = []  # the tests that ran a task on these workers, in order
        # The store lives here: port 0 lets the OS pick a free port, no race with other tests or xdist workers.
        self.store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=START_TIMEOUT_S),
                                   wait_for_workers=False)
        self.tasks = 0
        library = _kernel_library()
        ctx = mp.get_context("spawn")
        self.conns: list[Connection] = []
        self.procs = []
        saved = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the workers before torch starts its pool
        try:
            for rank in range(world):
                mine, theirs = ctx.Pipe()
                proc = ctx.Process(target=serve, args=(rank, world, self.store.port, theirs, library), daemon=True)
                proc.start()
                theirs.close()
                self.conns.append(mine)
                self.procs.append(proc)
        finally:
            if saved is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = saved
        replies = self._collect(START_TIMEOUT_S, "did not start")
        errors = {r: text for r, (kind, text) in replies.items() if kind != "ready"}
        if errors:
            self.close()  # the workers that did not start: their errors say why
            raise RankFailure(world, errors, {})

    def run(self, fn: Callable[..., Any], args: tuple, timeout_s: float, deadline_s: float) -> list[Any]:
        """fn(rank, world, *args) on every worker; results in rank order, or RankFailure."""
        self.tasks += 1
        test = os.environ.get("PYTEST_CURRENT_TEST", "(outside a test)").rsplit(" (", 1)[0]
        if not self.tests or self.tests[-1] != test:
            self.tests.append(test)
        message = pickle.dumps((self.tasks, fn, args, timeout_s), protocol=pickle.HIGHEST_PROTOCOL)
        for conn in self.conns:
            conn.send_bytes(message)
        replies = self._collect(deadline_s, f"no result within the {deadline_s:g} s deadline")
        errors = {r: text for r, (kind, text) in replies.items() if kind != "ok"}
        if errors:
            raise RankFailure(self.world, errors, {r: v for r, (k, v) in replies.items() if k == "ok"})
        return [replies[r][1] for r in range(self.world)]

    def _collect(self, deadline_s: float, late: str) -> dict[int, tuple[str, Any]]:
        """One reply per rank; a rank that dies or is late is an ("error", why) reply."""
        replies: dict[int, tuple[str, Any]] = {}
        deadline = time.monotonic() + deadline_s
        waiting = {conn: rank for rank, conn in enumerate(self.conns)}
        while waiting:
            ready = wait(list(waiting), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            for conn in ready:
                rank = waiting.pop(conn)  # type: ignore[call-overload]
                try:
                    replies[rank] = pickle.loads(conn.recv_bytes())  # type: ignore[union-attr]
                except (EOFError, OSError):
                    self.procs[rank].join(5)
                    replies[rank] = ("error", f"the worker died (exit code {self.procs[rank].exitcode})")
                if replies[rank][0] == "error":  # the others are likely stuck in a collective: don't wait long
                    deadline = min(deadline, time.monotonic() + GRACE_S)
        for rank in waiting.values():
            replies[rank] = ("error", f"{late} (killed)")
        return replies

    def stop(self) -> None:
        """Ask every worker to stop (close() then waits for them)."""
        for conn in self.conns:
            try:
                conn.send_bytes(pickle.dumps(None))
            except OSError:
                pass

    def close(self) -> list[str]:
        """Stop the workers (asked first, killed if they do not stop); returns what went wrong with each that
        did not exit with status 0 by itself (a crash, a kill, a hang), empty when all did."""
        self.stop()
        problems = []
        for rank, proc in enumerate(self.procs):
            proc.join(STOP_TIMEOUT_S)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
                problems.append(f"rank {rank} (pid {proc.pid}) did not stop within {STOP_TIMEOUT_S:g} s (killed)")
            elif proc.exitcode != 0:
                problems.append(f"rank {rank} (pid {proc.pid}) exited with {_status(proc.exitcode)}")
        for conn in self.conns:
            conn.close()
        return problems

    def crash_report(self, problems: list[str]) -> str:
        """The message for `problems` (from close): the workers and the tests that ran on them."""
        return (f"gloo worker(s) of the {self.world}-rank pool did not exit cleanly: {'; '.join(problems)}. "
                f"Tests that ran on these workers: {', '.join(self.tests) or 'none'}")


def _status(exitcode: Optional[int]) -> str:
    if exitcode is not None and exitcode < 0:
        return f"signal {signal.Signals(-exitcode).name}"
    return f"status {exitcode}"


def close_checked(pool: GlooPool) -> None:
    """Close `pool`; WorkerCrash if a worker did not exit cleanly."""
    problems = pool.close()
    if problems:
        raise WorkerCrash(pool.crash_report(problems))


_POOLS: "OrderedDict[int, GlooPool]" = OrderedDict()  # least recently used first


def _shared_pool(world: int) -> GlooPool:
    """The session's pool of `world` workers, started (after stopping unused ones over MAX_WORKERS) if needed."""
    pool = _POOLS.get(world)
    if pool is None:
        while _POOLS and sum(p.world for p in _POOLS.values()) + world > MAX_WORKERS:
            close_checked(_POOLS.popitem(last=False)[1])
        pool = _POOLS[world] = GlooPool(world)
    _POOLS.move_to_end(world)
    return pool


def run_on_ranks(
    world: int, fn: Callable[..., Any], *args: Any, timeout_s: float = COLLECTIVE_TIMEOUT_S,
    deadline_s: float = DEADLINE_S, breaks_group: bool = False, fresh: bool = False,
) -> list[Any]:
    """fn(rank, world, *args) on `world` gloo ranks; returns the per-rank results in rank order.

    `fn` must be a module-level function and `args` picklable (both travel by pickle). Raises RankFailure
    (an AssertionError) with each failing rank's traceback. `timeout_s` bounds every collective,
    `deadline_s` the whole call.
    """
    pool = GlooPool(world) if fresh else _shared_pool(world)
    try:
        results = pool.run(fn, args, timeout_s, deadline_s)
    except BaseException as failure:  # a failed task may have left peers in a collective: new workers next time
        _discard(pool)
        problems = pool.close()
        if problems and isinstance(failure, RankFailure):
            failure.args = (f"{failure.args[0]}\n{pool.crash_report(problems)}",)
        raise
    if fresh or breaks_group:  # a group no later task may use
        _discard(pool)
        close_checked(pool)
    return results


def _discard(pool: GlooPool) -> None:
    if _POOLS.get(pool.world) is pool:
        del _POOLS[pool.world]


def close_all() -> list[str]:
    """Stop every pool; the crash reports of those whose workers did not exit cleanly."""
    reports = []
    for pool in _POOLS.values():  # all at once: their interpreters shut down side by side
        pool.stop()
    while _POOLS:
        pool = _POOLS.popitem()[1]
        problems = pool.close()
        if problems:
            reports.append(pool.crash_report(problems))
    return reports


atexit.register(close_all)  # outside pytest (tests/conftest.py closes them at the session's end and checks)
