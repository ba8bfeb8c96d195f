"""Datasets on disk: barrier-guarded downloads and errors that say where the files must go."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, TypeVar

from src import comm

T = TypeVar("T")


def resolve_root(root: str) -> Path:
    """data.root with ~ expanded; relative paths stay relative to the launch directory."""
    return Path(os.path.expanduser(root))


def guarded(build: Callable[[], T]) -> T:
    """Run `build` (which may download) on local rank 0 of each node first, then on the other ranks.

    The other ranks find the files already there; if the first rank fails, they all raise instead
    of hanging at a barrier (src.comm.zero_first).
    """
    with comm.zero_first(local=True):
        return build()


def require_dir(path: Path, what: str, how: str) -> None:
    """FileNotFoundError unless `path` is a directory; the message says what belongs there and how to get it."""
    if not path.is_dir():
        raise FileNotFoundError(f"{what} not found: expected the folder {path.resolve()} ({how})")


def missing_download_message(dataset: str, folder: Path, downloadable: bool) -> str:
    """The message for a dataset whose files are absent."""
    msg = f"{dataset} not found: expected the files under {folder.resolve()}"
    if downloadable:
        msg += (". Set data.download=true to let torchvision download it there (local rank 0 of each node "
                "downloads, the others wait), or put the extracted files there yourself (see docs/data.md)")
    return msg
