"""Rank-aware logging: INFO on rank 0's console, WARNING elsewhere, one log file per rank, tqdm on rank 0.

Without this, every torchrun process prints every line and logs repeat W times.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, Iterable, Optional

from tqdm import tqdm

FORMAT = "%(asctime)s %(levelname)s [rank %(rank)d] %(name)s: %(message)s"


class _TqdmHandler(logging.StreamHandler):
    """Writes through tqdm.write so log lines do not tear the progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # logging must never crash training
            self.handleError(record)


class _RankFilter(logging.Filter):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True


def setup_logging(run_dir: Optional[Path], rank: int) -> None:
    """Configure the root logger: console (INFO on rank 0, WARNING elsewhere) + run_dir/logs/rank{r}.log."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    root.setLevel(logging.INFO)
    formatter = logging.Formatter(FORMAT, datefmt="%H:%M:%S")
    console = _TqdmHandler()
    console.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    handlers: list[logging.Handler] = [console]
    if run_dir is not None:
        log_dir = Path(run_dir) / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_dir / f"rank{rank}.log"))
    for handler in handlers:
        handler.setFormatter(formatter)
        handler.addFilter(_RankFilter(rank))
        root.addHandler(handler)
    logging.captureWarnings(True)


def write_to_log_files(message: str, level: int = logging.INFO, exc_info: Any = None) -> None:
    """Append `message` (and exc_info's traceback) to the run's log files only: for what the console already
    shows in its own form (a summary, an error message), or must not show (a traceback)."""
    logger = logging.getLogger("src.logger")
    record = logger.makeRecord(logger.name, level, __file__, 0, message, None, exc_info)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            try:
                handler.handle(record)  # its own filters add the rank that FORMAT names
            except Exception:  # noqa: BLE001 - a log file's copy must never hide what went wrong
                pass


def progress(iterable: Iterable, total: int, enabled: bool, desc: str) -> tqdm:
    """A tqdm bar over `iterable` that only rank 0 shows (`enabled=False` elsewhere)."""
    return tqdm(iterable, total=total, desc=desc, disable=not enabled, dynamic_ncols=True, leave=False,
                file=sys.stderr, mininterval=1.0)
