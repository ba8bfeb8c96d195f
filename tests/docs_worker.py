"""A process that runs documented commands one after another, each in a child forked from it: `python train.py
ARGS` without paying for the interpreter's and the libraries' start-up each time.

Run as `python tests/docs_worker.py`; it reads one JSON request a line on stdin,
{"script": "train.py", "args": [...], "cwd": "...", "log": "...", "timeout_s": 300}, and answers one JSON line on
the stdout it started with: {"rc": exit status}, or {"rc": null, "why": "..."} when the command did not end as a
process must: killed by a signal, not exited within timeout_s (then killed, with its process group), or exited
leaving processes of its own running (killed too).

The child runs the script as `python SCRIPT ARGS` would (runpy as __main__, so Hydra's command line, composition,
sweeps and error report are the real ones), with stdout and stderr (file descriptors 1 and 2, so C++ and library
output too) going to `log`, and then leaves through the interpreter's normal shutdown: atexit handlers run,
non-daemon threads are waited for, multiprocessing ends its children, and the exit status is the one a user
would see. Only third-party libraries are loaded before the fork (PRELOAD): the project's modules are imported by
each command itself, as in a new process, so a command that lacks an import fails here as it would for a user,
and nothing one command changes (working folder, environment, threads, logging, signal handlers, registries, a
process group) reaches the next. Variables that libraries read when imported (HF_HOME, TORCH_HOME,
HF_HUB_OFFLINE, OMP_NUM_THREADS) are the worker's own, set by its caller.
"""
from __future__ import annotations

import importlib
import json
import os
import runpy
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import IO, NoReturn

REPO = Path(__file__).resolve().parents[1]
# The libraries whose import is most of a command's start-up (seconds each). No module of the project: those
# each command imports itself (some register operators or config schemas in these libraries when imported).
# torch's thread pools start at the first parallel operation, which the worker never runs: a fork is safe.
PRELOAD = ("torch", "torchvision", "torchvision.models.detection", "torchvision.transforms.v2", "hydra",
           "hydra.core.config_store", "omegaconf", "numpy", "PIL.Image", "torch.distributed", "torch.utils.data",
           "torch.utils.tensorboard")
LEFTOVER_GRACE_S = 5.0  # how long a command's own child processes may take to end after it exited


def _run_script(script: Path, args: list[str]) -> int:
    """`python script args` in this process; the exit status Python would give."""
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(script.parent))  # as the interpreter does for a script
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001  (what the interpreter would print before exiting 1)
        traceback.print_exc()
        return 1
    return 0


def _child(request: dict, replies: IO[str]) -> NoReturn:
    """The forked command: own process group, its log as stdout and stderr, no stdin; exits like a process."""
    os.setpgid(0, 0)  # a timeout kills the command with whatever it started
    replies.close()  # the worker's answers are not the command's to write
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    with open(request["log"], "wb") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    os.chdir(request["cwd"])
    code = _run_script(REPO / request["script"], list(request["args"]))
    sys.stdout.flush()
    sys.stderr.flush()
    raise SystemExit(code)  # through the worker's frames (none catches it) into the interpreter's shutdown


def _group(pgid: int) -> list[str]:
    """'pid: command line' of every live process in process group `pgid` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # fields after the name: state, ppid, pgrp, ...
            found.append(f"{entry.name}: {cmdline[:200]}")
    return found


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _wait(pid: int, timeout_s: float) -> dict:
    """The answer for the command in child `pid` (see the module docstring)."""
    deadline = time.monotonic() + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            _kill_group(pid)
            os.waitpid(pid, 0)
            return {"rc": None, "why": f"did not exit within {timeout_s:g} s (killed)"}
        time.sleep(0.05)
    if os.WIFSIGNALED(status):
        _kill_group(pid)
        return {"rc": None, "why": f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"}
    rc = os.WEXITSTATUS(status)
    left = _group(pid)
    until = time.monotonic() + LEFTOVER_GRACE_S
    while left and time.monotonic() < until:
        time.sleep(0.1)
        left = _group(pid)
    if left:
        _kill_group(pid)
        return {"rc": None, "why": f"exited ({rc}) leaving {len(left)} process(es) of its own running (killed): "
                                   + "; ".join(left)}
    return {"rc": rc}


def main() -> None:
    """Answer requests until stdin closes, then leave through the interpreter's normal shutdown."""
    sys.path[0] = str(REPO)  # tests/ would not be on a command's path; the repository is (its scripts' folder)
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # between commands, stray prints must not enter the replies
    for name in PRELOAD:
        importlib.import_module(name)
    replies.write(json.dumps({"ready": os.getpid()}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request, replies)
        replies.write(json.dumps(_wait(pid, float(request["timeout_s"]))) + "\n")


if __name__ == "__main__":
    main()
