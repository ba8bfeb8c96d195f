"""Bounded queues and daemon threads between the training loop and the experiment trackers.

Each tracker has its own queue and thread: the training thread only enqueues (put_nowait), so a
tracker stuck on a slow server delays nothing but itself, not training and not the other trackers.
When a tracker's queue is full, the newest rows are dropped for it (never for metrics.jsonl, which the
Tracker writes itself) and the drop is logged. Failures are logged as errors with the traceback, once
per tracker, and the failed tracker receives nothing more; the run goes on.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from src.engine.trackers.records import read_records, write_records
from src.engine.trackers.sink import FINISHED, RunInfo, Sink

log = logging.getLogger(__name__)

# Only the tracker threads write <run dir>/trackers.json; one at a time.
_RECORDS_LOCK = threading.Lock()


class _TrackerThread:
    """One tracker's queue and daemon thread."""

    def __init__(self, sink: Sink, queue_size: int) -> None:
        self.sink = sink
        self.failed: str | None = None  # the error that stopped this tracker
        self.dropped = 0  # rows that found the queue full
        self.queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self.thread = threading.Thread(target=self._work, name=f"synctrain-tracker-{sink.name}", daemon=True)
        self.thread.start()

    def submit(self, item: tuple) -> None:
        try:
            self.queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning("tracker %s is behind: %d row(s) dropped for it so far (metrics.jsonl keeps every row; "
                            "raise tracker.queue_size to buffer more)", self.sink.name, self.dropped)

    def put(self, item: tuple, timeout_s: float) -> bool:
        try:
            self.queue.put(item, timeout=max(timeout_s, 0.0))
            return True
        except queue.Full:
            return False

    def _work(self) -> None:
        while True:
            item = self.queue.get()
            kind = item[0]
            if kind == "stop":
                return
            if kind == "flush":
                item[1].set()
            elif self.failed is None:
                self._call(kind, item[1:])

    def _call(self, kind: str, args: tuple) -> None:
        sink = self.sink
        try:
            if kind == "start":
                info, runs = args
                runs[sink.name] = sink.start(info, runs.get(sink.name))
                with _RECORDS_LOCK:
                    write_records(info.run_dir, {**read_records(info.run_dir), sink.name: runs[sink.name]})
            elif kind == "log":
                sink.log(args[0])
            elif kind == "artifact":
                sink.artifact(args[0])
            elif kind == "finish":
                sink.finish(args[0])
        except Exception as err:  # a tracker must never take training down, but must not fail quietly either
            self.failed = f"{type(err).__name__}: {err}"
            log.error("tracker %s failed in %s(): %s. It receives nothing more in this run; training goes on "
                      "and metrics.jsonl keeps every row.", sink.name, kind, self.failed, exc_info=True)


class BackgroundSinks:
    """Feeds each of `sinks` from its own daemon thread through a queue of at most `queue_size` items."""

    def __init__(self, sinks: Sequence[Sink], queue_size: int) -> None:
        self._threads = [_TrackerThread(sink, queue_size) for sink in sinks]
        self._closed = False

    @property
    def failed(self) -> dict[str, str]:
        """Tracker name -> the error that stopped it."""
        return {t.sink.name: t.failed for t in self._threads if t.failed is not None}

    @property
    def dropped(self) -> int:
        """Rows dropped because a tracker's queue was full (summed over trackers)."""
        return sum(t.dropped for t in self._threads)

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
        """Queue one metrics row for every tracker (dropped, with a warning, where a queue is full)."""
        self._submit(("log", row))

    def artifact(self, path: Path) -> None:
        """Queue a file for the trackers that keep artifacts."""
        self._submit(("artifact", path))

    def flush(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the trackers to take every queued item; False when one did not."""
        deadline = time.monotonic() + timeout_s
        events = []
        for t in self._threads:
            done = threading.Event()
            if not t.put(("flush", done), deadline - time.monotonic()):
                return False
            events.append(done)
        return all(e.wait(max(deadline - time.monotonic(), 0.0)) for e in events)

    def close(self, status: str = FINISHED, timeout_s: float = 60.0, setting: str = "") -> None:
        """Hand pending rows over, end every tracker run with `status`, stop the threads (at most ~timeout_s).

        `setting` names the config key that set `timeout_s`, for the message when a tracker is too slow.
        """
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            if t.put(("finish", status), deadline - time.monotonic()):
                t.put(("stop",), max(deadline - time.monotonic(), 0.1))
        for t in self._threads:
            t.thread.join(max(deadline - time.monotonic(), 0.1))
            if t.thread.is_alive():
                log.error("tracker %s did not finish within %s=%gs: its last rows may be missing "
                          "(metrics.jsonl has every row)", t.sink.name, setting or "the timeout", timeout_s)
            if t.dropped:
                log.error("%d metric row(s) were not sent to tracker %s: its queue (tracker.queue_size) was full; "
                          "metrics.jsonl has every row", t.dropped, t.sink.name)
            if t.failed is not None:
                log.error("tracker %s failed during this run (%s): its run is incomplete; metrics.jsonl has every "
                          "row", t.sink.name, t.failed)

    def _submit(self, item: tuple) -> None:
        if not self._closed:
            for t in self._threads:
                t.submit(item)
