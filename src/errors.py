"""UserError: a mistake in what the user gave (a config value, a data folder, a checkpoint, the device, the
network), as opposed to a program error.

The entry points print a UserError's message once (rank 0), without a traceback, and exit with
USER_ERROR_EXIT_CODE; every other exception keeps its traceback. It subclasses ValueError so that code and
tests that expect the ValueError the checks always raised keep working. Any layer may raise it: this module
imports nothing of the project.
"""
from __future__ import annotations

# The exit status of a run refused for a user's mistake (argparse's and many command-line tools' usage error).
USER_ERROR_EXIT_CODE = 2


class UserError(ValueError):
    """A mistake the user can fix: the message says what is wrong, the value, and what to do."""
