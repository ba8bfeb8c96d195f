"""The rank side of tests/support/gloo.py: one long-lived spawned process that runs task after task.

Every task starts from the state a freshly spawned worker would have, so a test cannot see what an
earlier test on the same worker did:
- process groups: each task forms a new default gloo group with src/process_group.py's init_distributed
  (over the pool's store, in a namespace of its own) and its destroy() tears it down afterwards together
  with every sub-group the task made. src.syncbn.groups keys its group caches on the WORLD group, so groups cached by an earlier
  task are never handed out again (rank_group raises, stats_group is None, create_* make new ones).
- torch's default seed, a freshly seeded `random`/numpy, one torch thread, the default dtype, grad
  mode, deterministic-algorithms flag, environment, working directory, and SyncBN's collective
  counters at zero.
src/comm.py holds no module state.
"""
from __future__ import annotations

import datetime
import gc
import importlib.util
import os
import pickle
import random
import sys
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from src import process_group

Task = tuple[int, Callable[..., Any], tuple, float]  # (number, fn, args, collective timeout in seconds)


def use_parent_kernels(library: Optional[str]) -> None:
    """Import the very kernel library the parent loaded (no rebuild, even if csrc/ changed since)."""
    if not library or not Path(library).exists():
        return  # not a file-backed module (the emulation): the worker loads its kernels itself
    from src.syncbn import functions

    spec = importlib.util.spec_from_file_location(Path(library).name.split(".")[0], library)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    functions.use_kernel_module(module)


class FreshState:
    """What a test may change in a worker's process, as it was when the worker had just started."""

    def __init__(self) -> None:
        self.environ = dict(os.environ)
        self.cwd = os.getcwd()
        self.seed = torch.initial_seed()  # torch's fixed default seed in a new process
        self.dtype = torch.get_default_dtype()
        self.deterministic = torch.are_deterministic_algorithms_enabled()

    def restore(self) -> None:
        """Put the process back into its just-started state (before every task)."""
        os.environ.clear()
        os.environ.update(self.environ)
        os.chdir(self.cwd)
        torch.set_num_threads(1)
        torch.set_default_dtype(self.dtype)
        torch.set_grad_enabled(True)
        torch.use_deterministic_algorithms(self.deterministic)
        torch.manual_seed(self.seed)
        random.seed()  # a new process seeds these from the OS, not from a fixed value
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        collectives = sys.modules.get("src.syncbn.collectives")
        if collectives is not None:
            for key in collectives.call_counts:
                collectives.call_counts[key] = 0


def _meet(store: dist.Store, name: str, rank: int, world: int, timeout_s: float) -> None:
    """Wait until every rank reached this point (through the store: no collective a test could pair with)."""
    store.set(f"{name}/{rank}", b"1")
    store.wait([f"{name}/{r}" for r in range(world)], datetime.timedelta(seconds=timeout_s))


def _run_task(rank: int, world: int, store: dist.Store, task: Task) -> tuple[str, Any]:
    number, fn, args, timeout_s = task
    tasks = dist.PrefixStore(f"task{number}/", store)  # the harness's own meeting points
    try:
        # As a training run forms its group: torchrun's environment (serve() set it) and agent store, the launch
        # handshake in a fresh namespace of that store, the timeouts.
        process_group.init_distributed(torch.device("cpu"), timeout_s=timeout_s, init_timeout_s=timeout_s)
        # gloo's init may return on one rank before a peer finished connecting; a rank that then tore the
        # group down at once (a task without collectives) would break the peer's half-made connection.
        _meet(tasks, "connected", rank, world, timeout_s)
        outcome: tuple[str, Any] = ("ok", fn(rank, world, *args))
    except BaseException:  # the parent reports it with the rank
        outcome = ("error", traceback.format_exc())
    if dist.is_initialized():
        try:  # nobody closes its connections while a peer may still be in a collective on them
            if outcome[0] == "ok":
                _meet(tasks, "finished", rank, world, timeout_s)
            else:  # report at once (the parent restarts the pool); peers need not wait for this rank
                tasks.set(f"finished/{rank}", b"1")
        except RuntimeError:
            pass  # a peer failed or died: the parent restarts the pool
        process_group.destroy()  # WORLD and every sub-group of this task, as the commands tear down
    return outcome


def serve(rank: int, world: int, store_port: int, conn: Connection, library: Optional[str]) -> None:
    """Worker main loop: answer "ready", then run each task received on `conn` until told to stop."""
    os.environ.update(  # what torchrun sets; the pool's parent serves the store, as torchrun's agent does
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store_port), RANK=str(rank), WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), TORCHELASTIC_USE_AGENT_STORE="True",
    )
    torch.set_num_threads(1)  # 2 cores shared by several processes: no oversubscription
    try:
        use_parent_kernels(library)
        store = dist.TCPStore("127.0.0.1", store_port, None, False, timeout=datetime.timedelta(seconds=120))
    except BaseException:
        conn.send_bytes(pickle.dumps(("error", traceback.format_exc())))
        return
    fresh = FreshState()
    conn.send_bytes(pickle.dumps(("ready", os.getpid())))
    while True:
        try:
            message = conn.recv_bytes()
        except EOFError:  # the parent is gone
            return
        try:
            task = pickle.loads(message)  # imports the test module that defines fn
        except BaseException:
            outcome: tuple[str, Any] = ("error", "the task could not be unpickled:\n" + traceback.format_exc())
        else:
            if task is None:  # stop: leave through the interpreter's shutdown, whose exit status the pool checks
                # The final collection would walk every object torch made (seconds on a busy machine); frozen,
                # the operating system frees them. Exit handlers and module teardown still run.
                gc.freeze()
                return
            fresh.restore()
            outcome = _run_task(rank, world, store, task)
        try:
            # Plain pickle, not the Connection's: tensors travel by value, not as shared memory.
            data = pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            data = pickle.dumps(("error", "the result could not be pickled:\n" + traceback.format_exc()))
        conn.send_bytes(data)
