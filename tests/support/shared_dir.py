"""A folder made once per test session, also when pytest-xdist spreads the tests over several workers."""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

import pytest
from filelock import FileLock


def session_root(factory: pytest.TempPathFactory) -> Path:
    """The base temp folder all workers of this session share (each xdist worker has its own basetemp below it)."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def made_once(factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """`<session root>/shared/<name>`, filled by `make(folder)` in the first worker that asks; the others wait on a
    file lock and reuse it. A folder left without its completion mark (a failed `make`) is made afresh."""
    parent = session_root(factory) / "shared"
    parent.mkdir(exist_ok=True)
    folder, done = parent / name, parent / f"{name}.done"
    with FileLock(str(parent / f"{name}.lock")):
        if not done.is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            done.touch()  # beside the folder, so the folder holds only what `make` wrote
    return folder


def fingerprint(folder: Path) -> dict[str, tuple[int, int]]:
    """{relative path: (size, mtime_ns)} of every file below `folder`: what a consumer must leave as it was."""
    return {p.relative_to(folder).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_unchanged(folder: Path, before: dict[str, tuple[int, int]]) -> None:
    """Fail naming the files a test added, removed or rewrote in a folder that is shared read-only."""
    after = fingerprint(folder)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"a test changed the shared {folder} (copy it with copy_run first): {changed[:10]}"
