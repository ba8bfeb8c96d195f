"""Logging while a run starts: on the console only, until the run folder may be written; then into its log files
too, beginning with the lines the start already printed (so `logs/rank<r>.log` tells the whole start).

A start that fails its checks writes no log file (the folder keeps its files byte for byte, or is not made).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from src.logger import setup_logging

_MAX_RECORDS = 10000  # a start logs tens of lines; this only bounds a runaway


class _StartRecords(logging.Handler):
    """Keeps the start's log records for the log files that do not exist yet."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.records) < _MAX_RECORDS:
            self.records.append(record)


_pending: _StartRecords | None = None


def launch_rank() -> int:
    """This process's global rank as torchrun set it (also before the process group exists)."""
    return int(os.environ.get("RANK", "0"))


def log_to_console() -> None:
    """Console logging for the start (INFO on rank 0, WARNING elsewhere); the records are kept for the files."""
    global _pending
    setup_logging(None, launch_rank())
    _pending = _StartRecords()
    logging.getLogger().addHandler(_pending)


def log_into(run_dir: Path, rank: int) -> None:
    """From now on also into `run_dir/logs/rank<rank>.log`, which first receives the start's kept records."""
    global _pending
    kept, _pending = _pending, None
    if kept is not None:
        logging.getLogger().removeHandler(kept)
    setup_logging(run_dir, rank)
    files = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    for record in kept.records if kept is not None else []:
        for handler in files:
            if record.levelno >= handler.level:
                handler.handle(record)
