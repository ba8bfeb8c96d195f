"""Run a function on W real gloo processes over loopback and collect each rank's return value.

Shared by the evaluation tests. Workers use one thread each (the machine is shared) and a 60 s timeout
on every collective, so a broken test fails instead of hanging.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import socket
import traceback
from typing import Any, Callable

import torch

from src import process_group

JOIN_TIMEOUT_S = 180


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, fn: Callable[..., Any], args: tuple, queue: Any) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
    )
    torch.set_num_threads(1)
    try:
        process_group.init_distributed(torch.device("cpu"), backend="gloo", timeout_s=60, init_timeout_s=60)
        queue.put((rank, fn(rank, world, *args)))
    except BaseException:  # the parent shows the traceback
        queue.put((rank, RankError(traceback.format_exc())))
    finally:
        process_group.destroy()


class RankError(str):
    """A worker's traceback, returned instead of its result."""


def run_ranks(fn: Callable[..., Any], world: int, *args: Any) -> list[Any]:
    """fn(rank, world, *args) on `world` spawned processes in one gloo group; results in rank order.

    `fn` must be a module-level function (spawn pickles it by name). Raises with the worker's
    traceback when any rank failed.
    """
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, fn, args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        results = dict(queue.get(timeout=JOIN_TIMEOUT_S) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=JOIN_TIMEOUT_S)
            if p.is_alive():
                p.kill()
    for rank in range(world):
        if isinstance(results[rank], RankError):
            raise AssertionError(f"rank {rank} of {world} failed:\n{results[rank]}")
    for p in procs:
        assert p.exitcode == 0, f"a worker exited with {p.exitcode}"
    return [results[r] for r in range(world)]
