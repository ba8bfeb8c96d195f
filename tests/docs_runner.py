"""The test side of tests/docs_worker.py: start the worker once, hand it commands, read their exit status and
output; a command that kills or hangs the worker fails alone and the next one gets a new worker."""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Optional

WORKER = Path(__file__).resolve().with_name("docs_worker.py")
START_TIMEOUT_S = 600  # the first import of torch, Hydra and the extensions on a busy CI machine


@dataclass
class Result:
    """A command's exit status (as the interpreter would give it) and everything it printed."""

    returncode: int
    output: str


class DocsRunner:
    """One worker process at a time, started on first use with environment `env`; its logs go to `log_dir`."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env, self.log_dir = env, log_dir
        self.proc: Optional[subprocess.Popen] = None
        self.count = 0

    def _start(self) -> subprocess.Popen:
        with open(self.log_dir / "worker.log", "ab") as errors:  # what it prints between commands
            proc = subprocess.Popen([sys.executable, str(WORKER)], env=self.env, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=errors, text=True, start_new_session=True)
        if self._reply(proc, START_TIMEOUT_S) is None:
            self._kill(proc)
            raise RuntimeError(f"the docs worker did not start: {(self.log_dir / 'worker.log').read_text()[-3000:]}")
        return proc

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
        """`python script args` from `cwd`, in the worker."""
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        self.count += 1
        log = self.log_dir / f"{self.count:03d}.log"
        request = {"script": script, "args": args, "cwd": str(cwd), "log": str(log)}
        self.proc.stdin.write(json.dumps(request) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        reply = self._reply(self.proc, timeout_s)
        if reply is None:  # hung or died: what it printed is in the log; the next command gets a new worker
            try:
                died: Optional[int] = self.proc.wait(timeout=5)  # it closed its end: it is exiting
            except subprocess.TimeoutExpired:
                died = None
            self._kill(self.proc)
            self.proc = None
            note = f"[timed out after {timeout_s:g} s]" if died is None else f"[the process died: exit {died}]"
            return Result(-9 if died is None else (died or 1), f"{log.read_text(errors='replace')}\n{note}")
        return Result(int(reply["rc"]), log.read_text(errors="replace"))

    def close(self) -> None:
        """End the worker (stdin closed: it leaves its loop)."""
        if self.proc is not None:
            self.proc.stdin.close()  # type: ignore[union-attr]
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._kill(self.proc)
            self.proc = None
