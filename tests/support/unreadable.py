"""Images that cannot be decoded, as users meet them (a copy cut short), and what their error must say."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from src.data import close_loaders
from src.data.image_files import UnreadableImage


def truncate(path: Path) -> Path:
    """Keep the first half of the file: PIL still reads its header (size, mode), decoding the pixels fails."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def expected(path: Path, where: str, index: int, kind: str = "image") -> str:
    """The start of the error for `path`, sample `index` of `where` ("training split 'train'", "input=DIR")."""
    return f"cannot read {kind} {path} ({where}, sample {index}): "


def error_of_loading(loader: Any) -> str:
    """The UnreadableImage message of iterating `loader` to its end (it must raise one); the loader is closed."""
    with pytest.raises(UnreadableImage) as info:
        try:
            for _ in loader:
                pass
        finally:
            close_loaders(loader)
    return str(info.value)
