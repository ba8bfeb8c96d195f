"""One folder of results per test run, made by whichever pytest process gets there first.

Under pytest-xdist each worker has its own session fixtures; an expensive one (minutes of container
work) should run once and leave its results as files that every worker reads. pytest-xdist's docs
give the pattern: a folder beside the workers' base temp folders, guarded by a file lock.
"""
from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path

import pytest


def shared_results(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """The folder `name` after `make(folder)` has filled it, once per test run (across xdist workers)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        folder = tmp_path_factory.mktemp(name, numbered=True)
        make(folder)
        return folder
    root = tmp_path_factory.getbasetemp().parent  # shared by the workers of this run
    folder = root / name
    with open(root / f"{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            if not (folder / ".complete").exists():
                folder.mkdir(exist_ok=True)
                make(folder)
                (folder / ".complete").touch()
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
    return folder
