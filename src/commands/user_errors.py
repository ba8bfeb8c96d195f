"""How a command ends on a user's mistake: one message on stderr, once, exit code 2, no traceback.

Every entry point (train.py, evaluate.py, predict.py, export.py, the scripts users run) wraps its main function
in `reported`. A `src.errors.UserError` raised anywhere below it ends the process with USER_ERROR_EXIT_CODE and
`error: <message>` on stderr, also written to the run's log files when logging into a run folder is set up
(src/logger.py). Any other exception is a program error and keeps its traceback (and, under torchrun, the error
file its failure summary prints); its traceback also goes to the log files. HYDRA_FULL_ERROR=1 prints a
UserError's traceback too (the exit code stays 2).

Under torchrun every process usually meets the same mistake (the same command line, config and files), and W
copies of one message bury it. Rank 0 prints its message; another rank prints only a message rank 0 did not meet:
it looks for rank 0's in torchrun's store (which outlives the workers) for up to RANK0_WAIT_S, and prints its own,
prefixed with its number, when rank 0's does not come, or at once when torchrun stops it (SIGTERM) while it waits:
a mistake only one rank meets (its node's data folder or GPUs, a corrupt file in its shard) makes the other ranks
fail in their collectives, and torchrun then stops this rank. A count in the store lets only the first of the
ranks print a message. Without torchrun's store (one process, or another launcher) every rank prints its own,
prefixed where not rank 0.
Ctrl-C that reaches it (outside training, which stops at a step and saves: src/engine/preemption.py) ends the
command with one line and INTERRUPTED_EXIT_CODE.

This module imports neither torch nor the project's configs at import time, so that a mistake on the command
line (src/commands/command_line.py) is reported before torch loads.
"""
from __future__ import annotations

import datetime
import functools
import hashlib
import logging
import os
import signal
import sys
import time
import traceback
from typing import Any, Callable, NoReturn, Optional, TypeVar

from src.errors import USER_ERROR_EXIT_CODE, UserError
from src.logger import write_to_log_files

F = TypeVar("F", bound=Callable[..., Any])

FULL_ERROR_ENV = "HYDRA_FULL_ERROR"  # Hydra's own switch for full tracebacks; "1" shows a UserError's too
# 128 + SIGINT, what a shell reports for a program that Ctrl-C ended (training uses it too, after saving last.pt).
INTERRUPTED_EXIT_CODE = 128 + signal.SIGINT
# How long a rank other than 0 waits for rank 0 to meet the same mistake before printing its own: the ranks reach
# the same check within moments of each other, seconds apart on a loaded machine.
RANK0_WAIT_S = 10.0
_POLL_S = 0.05
_STORE_CONNECT_S = 5.0
_KEY_PREFIX = "synctrain/user_error"


def reported(main: F) -> F:
    """`main` with a UserError ending the process as `exit_on_user_error` says; other exceptions propagate
    with their traceback (recorded in torchrun's error file under torchrun, and in the run's log files)."""
    @functools.wraps(main)
    def checked(*args: Any, **kwargs: Any) -> Any:
        try:
            return main(*args, **kwargs)
        except UserError as err:
            exit_on_user_error(err)
        except KeyboardInterrupt:  # Ctrl-C outside training's own handling (a build, evaluate.py, predict.py, ...)
            if _rank() == 0:
                print("interrupted (Ctrl-C)", file=sys.stderr, flush=True)
            raise SystemExit(INTERRUPTED_EXIT_CODE) from None
        except Exception:
            write_to_log_files("the command failed with a program error", logging.ERROR, sys.exc_info())
            raise

    @functools.wraps(main)
    def entry(*args: Any, **kwargs: Any) -> Any:
        # torchrun's @record writes a program error's traceback to the error file its summary prints; a UserError
        # has become SystemExit(2) inside it, which it passes on without a file (its summary then shows no
        # traceback). Imported here: it imports torch, which a mistake on the command line must not wait for.
        from torch.distributed.elastic.multiprocessing.errors import record

        return record(checked)(*args, **kwargs)

    return entry  # type: ignore[return-value]


def exit_on_user_error(err: UserError, *, same_on_every_rank: bool = False) -> NoReturn:
    """Print `err` once (see the module docstring), write it to the log files, exit with USER_ERROR_EXIT_CODE.

    same_on_every_rank: the mistake was found from what every rank has alike (the command line), so rank 0
    prints it and the others say nothing, without asking torchrun's store.
    """
    full = os.environ.get(FULL_ERROR_ENV) == "1"
    message = _without_worker_traceback(str(err))
    text = "".join(traceback.format_exception(err)).rstrip() if full else f"error: {message}"
    write_to_log_files(message, logging.ERROR, (type(err), err, err.__traceback__) if full else None)
    rank = _rank()
    prints = rank == 0 if same_on_every_rank else _prints(message, rank)
    if prints:
        print(text if full or rank == 0 else f"error (rank {rank}): {message}", file=sys.stderr, flush=True)
    raise SystemExit(USER_ERROR_EXIT_CODE)


def _without_worker_traceback(message: str) -> str:
    """A mistake found in a DataLoader worker (an unreadable image) reaches this process with the worker's
    traceback inside its message ("Caught X in DataLoader worker process 0. Original Traceback ... X: <message>",
    torch's ExceptionWrapper): only its last line is the user's message."""
    if not message.startswith("Caught ") or "\nOriginal Traceback" not in message:
        return message
    last = message.rstrip().splitlines()[-1]
    name, sep, rest = last.partition(": ")
    return rest if sep and name.replace(".", "").replace("_", "").isalnum() else last


def _rank() -> int:
    """This process's global rank as its launcher set it (0 without one)."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def _message_key(kind: str, message: str) -> str:
    """This launch's key of `kind` for `message`: torchrun keeps one store for every restart of its workers."""
    run = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"{_KEY_PREFIX}/{run}/{attempt}/{kind}/{hashlib.sha256(message.encode()).hexdigest()}"


def _agent_store() -> Optional[Any]:
    """A client of the store torchrun's agent serves for this job (it outlives the workers), or None."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or not addr or not port:
        return None
    try:
        import torch.distributed as dist

        return dist.TCPStore(addr, int(port), is_master=False, wait_for_workers=False,
                             timeout=datetime.timedelta(seconds=_STORE_CONNECT_S))
    except Exception:  # noqa: BLE001 - no store: each rank prints its own message
        return None


class _Stopped(Exception):
    """torchrun's SIGTERM arrived while this rank waited for rank 0."""


def _prints(message: str, rank: int) -> bool:
    """Whether this rank prints `message` (the module docstring's protocol; True without torchrun's store)."""
    store = _agent_store()
    if store is None:
        return True
    try:
        if rank == 0:
            store.set(_message_key("rank0", message), "1")
        elif _rank0_met(store, message):
            return False
        return store.add(_message_key("printed", message), 1) == 1  # atomic: exactly one rank counts 1
    except Exception:  # noqa: BLE001 - the store went away: print ours
        return True


def _rank0_met(store: Any, message: str) -> bool:
    """Whether rank 0 meets `message` within RANK0_WAIT_S; False at once on SIGTERM (torchrun stopping us)."""
    key = _message_key("rank0", message)

    def stopped(signum: int, frame: Any) -> None:
        raise _Stopped

    try:
        previous = signal.signal(signal.SIGTERM, stopped)
    except ValueError:  # not the main thread: no handler, the wait only
        previous = None
    try:
        deadline = time.monotonic() + RANK0_WAIT_S
        while time.monotonic() < deadline:
            if store.check([key]):
                return True
            time.sleep(_POLL_S)  # short waits: the handler runs between them
        return False
    except _Stopped:
        return False
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
