"""UserError: a mistake in what the user gave (a config value, a data folder, a checkpoint, the device, the
network), as opposed to a program error.

The entry points print a UserError's message once (rank 0), without a traceback, and exit with
USER_ERROR_EXIT_CODE; every other exception keeps its traceback. It subclasses ValueError so that code and
tests that expect the ValueError the checks always raised keep working. Any layer may raise it: this module
imports nothing of the project. `closest_name` gives such messages their "did you mean".
"""
from __future__ import annotations

import difflib
import os
from typing import Iterable, Optional

# The exit status of a run refused for a user's mistake (argparse's and many command-line tools' usage error).
USER_ERROR_EXIT_CODE = 2


class UserError(ValueError):
    """A mistake the user can fix: the message says what is wrong, the value, and what to do."""


def closest_name(name: str, names: Iterable[str]) -> Optional[str]:
    """The name in `names` that `name` most likely misspells (for a message's "did you mean"), or None.

    Fewest single-character edits wins (then the longer common prefix: resnet21 -> resnet20, not resnet32); a
    typo is a few edits (at most a third of the name, 2 for short names) that keep most letters (difflib's ratio
    >= 0.6), so val_size suggests nothing rather than eval_batch_size.
    """
    def edits(a: str, b: str) -> int:
        row = list(range(len(b) + 1))
        for i, ca in enumerate(a, 1):
            prev, row[0] = row[0], i
            for j, cb in enumerate(b, 1):
                prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
        return row[-1]

    def prefix(a: str, b: str) -> int:
        return len(os.path.commonprefix([a, b]))

    limit = max(2, len(name) // 3)
    scored = [(edits(name, n), -prefix(name, n), n) for n in set(names) if n != name
              and difflib.SequenceMatcher(None, name, n).ratio() >= 0.6]
    return min((s for s in scored if s[0] <= limit), default=(0, 0, None))[2]


class MissingFileError(UserError, FileNotFoundError):
    """A file or folder the user named, or that their config implies, is not there (a data folder, a checkpoint,
    a weights file, predict.py's input). Also a FileNotFoundError, so code that catches that still does."""
