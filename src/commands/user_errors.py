"""How a command ends on a user's mistake: one message on stderr, once, exit code 2, no traceback.

Every entry point (train.py, evaluate.py, predict.py, export.py, the scripts users run) wraps its main function
in `reported`. A `src.errors.UserError` raised anywhere below it ends the process with USER_ERROR_EXIT_CODE and
`error: <message>` on stderr, also written to the run's log files when logging into a run folder is set up
(src/logger.py). Any other exception is a program error and keeps its traceback (and, under torchrun, the error
file its failure summary prints); its traceback also goes to the log files. HYDRA_FULL_ERROR=1 prints a
UserError's traceback too (the exit code stays 2).

Under torchrun every process usually meets the same mistake (the same command line, config and files), and W
copies of one message bury it. Rank 0 prints; another rank prints only a message rank 0 did not: it posts its
message in torchrun's store and waits up to RANK0_WAIT_S for rank 0's there (when rank 0 failed too, torchrun
usually stops this rank before that). A mistake that only one rank sees (its node's data folder, GPUs, files) is
therefore printed by that rank, prefixed with its number. Ctrl-C that reaches it (outside training, which stops
at a step and saves: src/engine/preemption.py) ends the command with one line and INTERRUPTED_EXIT_CODE.

This module imports neither torch nor the project's configs at import time, so that a mistake on the command
line (src/commands/command_line.py) is reported before torch loads.
"""
from __future__ import annotations

import datetime
import functools
import logging
import os
import signal
import sys
import traceback
from typing import Any, Callable, NoReturn, Optional, TypeVar

from src.errors import USER_ERROR_EXIT_CODE, UserError
from src.logger import write_to_log_files

F = TypeVar("F", bound=Callable[..., Any])

FULL_ERROR_ENV = "HYDRA_FULL_ERROR"  # Hydra's own switch for full tracebacks; "1" shows a UserError's too
# How long a rank other than 0 waits for rank 0's message before printing its own. Both ranks reach the same
# check within moments of each other; when only this rank failed, rank 0 is waiting for it in the rendezvous.
RANK0_WAIT_S = 10.0
# 128 + SIGINT, what a shell reports for a program that Ctrl-C ended (training uses it too, after saving last.pt).
INTERRUPTED_EXIT_CODE = 128 + signal.SIGINT
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

    same_on_every_rank: the mistake was found from what every rank has alike (the command line), so a rank other
    than 0 says nothing and needs no word from rank 0.
    """
    full = os.environ.get(FULL_ERROR_ENV) == "1"
    message = _without_worker_traceback(str(err))
    text = "".join(traceback.format_exception(err)).rstrip() if full else f"error: {message}"
    write_to_log_files(message, logging.ERROR, (type(err), err, err.__traceback__) if full else None)
    rank = _rank()
    if rank == 0:
        print(text, file=sys.stderr, flush=True)
        if not same_on_every_rank:
            _tell_other_ranks(message)
    elif not same_on_every_rank and not _rank0_said(message, rank):
        print(text if full else f"error (rank {rank}): {message}", file=sys.stderr, flush=True)
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


def _store_key(rank: int) -> str:
    """This launch's key for `rank`'s message: torchrun keeps one store for every restart of its workers."""
    run = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"{_KEY_PREFIX}/{run}/{attempt}/{rank}"


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


def _tell_other_ranks(message: str) -> None:
    """Rank 0: post `message` where the other ranks look for it (nothing without torchrun's store)."""
    store = _agent_store()
    if store is None:
        return
    try:
        store.set(_store_key(0), message)
    except Exception:  # noqa: BLE001 - the other ranks then print their own copy
        pass


def _rank0_said(message: str, rank: int) -> bool:
    """Whether rank 0 reported the same message within RANK0_WAIT_S (False without torchrun's store)."""
    store = _agent_store()
    if store is None:
        return False
    try:
        store.set(_store_key(rank), message)
        store.wait([_store_key(0)], datetime.timedelta(seconds=RANK0_WAIT_S))
        return store.get(_store_key(0)).decode() == message
    except Exception:  # noqa: BLE001 - rank 0 said nothing in time (or the store went away): print ours
        return False
