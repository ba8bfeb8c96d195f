"""One bounded queue and one daemon thread between the training loop and the experiment trackers.

The training thread only enqueues (put_nowait): a tracker stuck on a slow server delays nothing but
itself. When the queue is full, the newest rows are dropped for the trackers (never for metrics.jsonl,
which the Tracker writes itself) and the drop is logged. Failures are logged as errors with the
traceback, once per tracker, and the failed tracker receives nothing more; the run goes on.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from src.engine.trackers.records import read_records, write_records
from src.engine.trackers.sink import FINISHED, RunInfo, Sink

log = logging.getLogger(__name__)


class BackgroundSinks:
    """Feeds `sinks` from a daemon thread through a queue of at most `queue_size` pending items."""

    def __init__(self, sinks: Sequence[Sink], queue_size: int) -> None:
        self.sinks = list(sinks)
        self.failed: dict[str, str] = {}  # tracker name -> the error that stopped it
        self.dropped = 0  # rows that found the queue full
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="synctrain-trackers", daemon=True)
        self._thread.start()

    # --- training thread --------------------------------------------------------------------------
    def start(self, info: RunInfo, runs: dict[str, dict[str, str]]) -> None:
        """Open every tracker run; each one's reopening record is stored into `runs` (kept in checkpoints).

        `runs` comes from the resumed checkpoint; on a resume, a tracker it does not name reopens the run
        recorded in <run dir>/trackers.json, if any (src/engine/trackers/records.py). That file is read
        here, on the training thread, so the resumed run's checkpoints name every tracker run from the start.
        """
        if info.resumed:
            for name, record in read_records(info.run_dir).items():
                runs.setdefault(name, record)
        self._submit(("start", info, runs))

    def log(self, row: dict[str, Any]) -> None:
        """Queue one metrics row for every tracker (dropped, with a warning, when the queue is full)."""
        self._submit(("log", row))

    def artifact(self, path: Path) -> None:
        """Queue a file for the trackers that keep artifacts."""
        self._submit(("artifact", path))

    def flush(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the trackers to take every queued item; False when they did not."""
        done = threading.Event()
        if not self._put(("flush", done), timeout_s):
            return False
        return done.wait(timeout_s)

    def close(self, status: str = FINISHED, timeout_s: float = 60.0) -> None:
        """Hand pending rows over, end every tracker run with `status`, stop the thread (at most ~timeout_s)."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout_s
        if self._put(("finish", status), timeout_s):
            self._put(("stop",), max(deadline - time.monotonic(), 0.1))
        self._thread.join(max(deadline - time.monotonic(), 0.1))
        if self._thread.is_alive():
            log.error("experiment trackers %s did not finish within logger.close_timeout_s=%gs: their last rows "
                      "may be missing (metrics.jsonl has every row)", self._names(), timeout_s)
        if self.dropped:
            log.error("%d metric row(s) were not sent to trackers %s: their queue (logger.queue_size) was full; "
                      "metrics.jsonl has every row", self.dropped, self._names())
        for name, error in self.failed.items():
            log.error("tracker %s failed during this run (%s): its run is incomplete; metrics.jsonl has every row",
                      name, error)

    def _submit(self, item: tuple) -> None:
        if self._closed:
            return
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning("trackers %s are behind: %d row(s) dropped for them so far (metrics.jsonl keeps "
                            "every row; raise logger.queue_size to buffer more)", self._names(), self.dropped)

    def _put(self, item: tuple, timeout_s: float) -> bool:
        try:
            self._queue.put(item, timeout=max(timeout_s, 0.0))
            return True
        except queue.Full:
            return False

    def _names(self) -> str:
        return ",".join(s.name for s in self.sinks)

    # --- tracker thread ---------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            item = self._queue.get()
            kind = item[0]
            if kind == "stop":
                return
            if kind == "flush":
                item[1].set()
                continue
            for sink in self.sinks:
                if sink.name not in self.failed:
                    self._call(sink, kind, item[1:])

    def _call(self, sink: Sink, kind: str, args: tuple) -> None:
        try:
            if kind == "start":
                info, runs = args
                runs[sink.name] = sink.start(info, runs.get(sink.name))
                write_records(info.run_dir, {**read_records(info.run_dir), sink.name: runs[sink.name]})
            elif kind == "log":
                sink.log(args[0])
            elif kind == "artifact":
                sink.artifact(args[0])
            elif kind == "finish":
                sink.finish(args[0])
        except Exception as err:  # a tracker must never take training down, but must not fail quietly either
            self.failed[sink.name] = f"{type(err).__name__}: {err}"
            log.error("tracker %s failed in %s(): %s. It receives nothing more in this run; training goes on "
                      "and metrics.jsonl keeps every row.", sink.name, kind, self.failed[sink.name], exc_info=True)
