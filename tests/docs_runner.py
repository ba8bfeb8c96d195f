"""The test side of tests/docs_worker.py: start the worker once, hand it commands, read their exit status and
output.

A command that hangs, is killed or leaves processes running did not finish as a process must: `run` raises
CommandDidNotFinish, which no expectation of the caller can accept (a command "fails naming the missing path"
only by exiting with an error status). When the runner is closed the worker must exit through the interpreter's
normal shutdown with status 0 in time, or `close` raises naming the command that ran last.
"""
from __future__ import annotations

import json
import os
import select
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Optional

WORKER = Path(__file__).resolve().with_name("docs_worker.py")
START_TIMEOUT_S = 600  # the first import of torch and Hydra on a busy CI machine
REPLY_GRACE_S = 60  # beyond a command's own timeout, which the worker enforces: the worker itself is stuck
CLOSE_TIMEOUT_S = 120  # the worker's own interpreter shutdown


@dataclass
class Result:
    """A command's exit status (as the interpreter gave it) and everything it printed."""

    returncode: int
    output: str


class CommandDidNotFinish(AssertionError):
    """A command hung, was killed or left processes running: a failure, whatever it was expected to do."""


class DocsRunner:
    """One worker process at a time (`worker`, a script speaking tests/docs_worker.py's protocol), started on first
    use with environment `env`; its logs go to `log_dir`."""

    def __init__(self, env: dict[str, str], log_dir: Path, worker: Path = WORKER) -> None:
        self.env, self.log_dir, self.worker = env, log_dir, worker
        self.proc: Optional[subprocess.Popen] = None
        self.count = 0
        self.last = "(none yet)"  # the command that ran last, for close()'s error

    def _start(self) -> subprocess.Popen:
        with open(self.log_dir / "worker.log", "ab") as errors:  # what it prints between commands
            proc = subprocess.Popen([sys.executable, str(self.worker)], env=self.env, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=errors, text=True, start_new_session=True)
        if self._reply(proc, START_TIMEOUT_S) is None:
            self._kill(proc)
            raise RuntimeError(f"the docs worker did not start: {self._worker_log()}")
        return proc

    def _worker_log(self) -> str:
        return (self.log_dir / "worker.log").read_text(errors="replace")[-3000:]

    @staticmethod
    def _reply(proc: subprocess.Popen, timeout_s: float) -> Optional[dict]:
        """The worker's next answer, or None when it died or took longer than timeout_s."""
        stdout: IO[str] = proc.stdout  # type: ignore[assignment]
        ready, _, _ = select.select([stdout], [], [], timeout_s)
        line = stdout.readline() if ready else ""
        return json.loads(line) if line else None

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
        proc.wait()

    def run(self, script: str, args: list[str], cwd: Path, timeout_s: float) -> Result:
        """`python script args` from `cwd`, in a child of the worker; CommandDidNotFinish unless it exits in time."""
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        self.count += 1
        log = self.log_dir / f"{self.count:03d}.log"
        self.last = f"python {shlex.join([script, *args])} (in {cwd}; log {log})"
        request = {"script": script, "args": args, "cwd": str(cwd), "log": str(log), "timeout_s": timeout_s}
        self.proc.stdin.write(json.dumps(request) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        reply = self._reply(self.proc, timeout_s + REPLY_GRACE_S)
        output = log.read_text(errors="replace") if log.exists() else ""
        if reply is None:  # the worker itself hung or died; the next command gets a new one
            self._kill(self.proc)
            self.proc = None
            raise CommandDidNotFinish(f"the docs worker stopped answering while running {self.last}:\n"
                                      f"{output[-4000:]}\nworker log:\n{self._worker_log()}")
        if reply["rc"] is None:
            raise CommandDidNotFinish(f"{self.last} {reply['why']}:\n{output[-4000:]}")
        return Result(int(reply["rc"]), output)

    def close(self) -> None:
        """End the worker (stdin closed: it leaves its loop and the interpreter); it must exit 0 in time."""
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        proc.stdin.close()  # type: ignore[union-attr]
        try:
            code = proc.wait(timeout=CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._kill(proc)
            raise CommandDidNotFinish(f"the docs worker did not exit within {CLOSE_TIMEOUT_S} s after the last "
                                      f"command, {self.last}:\n{self._worker_log()}") from None
        if code != 0:
            raise CommandDidNotFinish(f"the docs worker exited with status {code} after the last command, "
                                      f"{self.last}:\n{self._worker_log()}")
