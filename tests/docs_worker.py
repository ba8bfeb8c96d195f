"""A process that runs documented commands one after another in itself: `python train.py ARGS` without a new
interpreter each time.

Run as `python tests/docs_worker.py`; it reads one JSON request a line on stdin,
{"script": "train.py", "args": [...], "cwd": "...", "log": "..."}, runs the script as `python SCRIPT ARGS` would
(runpy as __main__, so Hydra's command line, composition, sweeps and error report are the real ones), with
stdout and stderr (file descriptors 1 and 2, so C++ and library output too) going to `log`, and answers one JSON
line {"rc": exit status} on the stdout it started with. Python, torch, Hydra and the extensions load once.

What a command changes in the process and a fresh one would not have (working folder, environment, argv,
import path, threads, determinism, default dtype, logging, warning filters, signal handlers, a process group,
Hydra's job config, torch.compile's caches)
is put back before the next command, so each starts as a new process would. Variables that libraries read
when imported (HF_HOME, TORCH_HOME, HF_HUB_OFFLINE, OMP_NUM_THREADS) are the worker's own, set by its caller.
"""
from __future__ import annotations

import json
import logging
import os
import runpy
import signal
import sys
import traceback
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM)


class _Fresh:
    """The process state a command may change, as the worker started with it, and the way back to it."""

    def __init__(self) -> None:
        import torch

        self.cwd = os.getcwd()
        self.environ = dict(os.environ)
        self.path = list(sys.path)
        self.threads = torch.get_num_threads()
        self.dtype = torch.get_default_dtype()
        self.deterministic = (torch.are_deterministic_algorithms_enabled(),
                              torch.is_deterministic_algorithms_warn_only_enabled())
        self.cudnn = (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic)
        self.warnings = list(warnings.filters)
        self.handlers = {s: signal.getsignal(s) for s in SIGNALS}

    def restore(self) -> None:
        """Put everything back (after a command, whatever it did)."""
        import torch
        import torch.distributed as torch_dist

        if torch_dist.is_available() and torch_dist.is_initialized():
            torch_dist.destroy_process_group()
        if "torch._dynamo" in sys.modules:
            torch._dynamo.reset()
        from hydra.core.hydra_config import HydraConfig

        HydraConfig.instance().cfg = None  # the last job's; a new process has none until Hydra runs a job
        os.chdir(self.cwd)
        os.environ.clear()
        os.environ.update(self.environ)
        sys.path[:] = self.path
        torch.set_num_threads(self.threads)
        torch.set_default_dtype(self.dtype)
        torch.use_deterministic_algorithms(self.deterministic[0], warn_only=self.deterministic[1])
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = self.cudnn
        warnings.filters[:] = self.warnings
        for number, handler in self.handlers.items():
            signal.signal(number, handler)
        root = logging.getLogger()
        for handler in list(root.handlers):
            root.removeHandler(handler)
            handler.close()
        root.setLevel(logging.WARNING)
        logging.captureWarnings(False)


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


def _run(request: dict, fresh: _Fresh) -> int:
    """One request with fds 1 and 2 on its log file."""
    saved = os.dup(1), os.dup(2)
    with open(request["log"], "wb") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        os.chdir(request["cwd"])
        return _run_script(REPO / request["script"], list(request["args"]))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        fresh.restore()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def main() -> None:
    """Answer requests until stdin closes."""
    sys.path[0] = str(REPO)  # tests/ would not be on a command's path; the repository is (its scripts' folder)
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # between commands, stray prints must not enter the replies
    import hydra  # noqa: F401  (loaded once, before any command: that is the point)
    import torch  # noqa: F401

    import src.commands.train  # noqa: F401

    fresh = _Fresh()
    replies.write(json.dumps({"ready": os.getpid()}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        replies.write(json.dumps({"rc": _run(request, fresh)}) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # everything is written; the interpreter's teardown of torch & co. only costs seconds


if __name__ == "__main__":
    main()
