"""Datasets on disk: barrier-guarded downloads and errors that say where the files must go."""
from __future__ import annotations

import contextlib
import http.client
import os
import urllib.error
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from src import comm
from src.errors import MissingFileError, UserError

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
        raise MissingFileError(f"{what} not found: expected the folder {path.resolve()} ({how})")


def missing_download_message(dataset: str, folder: Path, downloadable: bool) -> str:
    """The message for a dataset whose files are absent."""
    msg = f"{dataset} not found: expected the files under {folder.resolve()}"
    if downloadable:
        msg += (". Set data.download=true to let torchvision download it there (local rank 0 of each node "
                "downloads, the others wait), or put the extracted files there yourself (see docs/data.md)")
    return msg


# What a download that cannot reach its server raises (urllib's errors, a dropped or refused connection, a
# timeout); not OSError at large, which also covers a full disk.
NETWORK_ERRORS = (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException)


@contextlib.contextmanager
def explained_download(dataset: str, url: str, archive_folder: Path, files_folder: Path) -> Iterator[None]:
    """A download in the body that fails for the network becomes a UserError naming the dataset, the URL and
    where to put the files by hand: the archive in `archive_folder` (torchvision then extracts it, checksum
    checked, instead of downloading) or the extracted files in `files_folder`."""
    try:
        yield
    except NETWORK_ERRORS as exc:
        name = url.rsplit("/", 1)[-1]
        raise UserError(
            f"data.download=true: downloading {dataset} from {url} failed ({type(exc).__name__}: {exc}). Without "
            f"network access here, fetch {name} elsewhere and put it in {archive_folder.resolve()} (it is then "
            f"extracted, not downloaded), or its extracted files in {files_folder.resolve()}") from exc
