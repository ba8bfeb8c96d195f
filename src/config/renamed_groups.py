"""Config groups renamed since runs were made with them: the command line's overrides of an old name are refused
with the new one (a checkpoint's stored config is read with the new names by src/engine/checkpoint/state.py)."""
from __future__ import annotations

import re
from typing import Sequence

from src.errors import UserError

# Old name -> new name. The command line is checked (refuse_renamed_groups) and a checkpoint's stored config is
# read with the new names (src/engine/checkpoint/state.py), so old runs still evaluate, predict and resume.
RENAMED_GROUPS = {"logger": "tracker"}
# What each new group holds, with examples, for the message that refuses the old name.
_RENAMED_HINTS = {"tracker": "the trackers' config group is now `tracker` (tracker=tensorboard, "
                             "tracker=[tensorboard,mlflow], tracker.mlflow.experiment=NAME)"}
# An override's group or top-level key: `logger=x`, `logger.a.b=x`, `+logger=x`, `++logger.a=x`, `~logger`,
# `logger@pkg=x`.
_OVERRIDE_KEY = re.compile(r"^(?:~|\+\+|\+)?([A-Za-z_]\w*)(?=[.=@]|$)")


def refuse_renamed_groups(argv: Sequence[str]) -> None:
    """Raise UserError naming the new group when an override uses a renamed one.

    The entry points' command-line check (src/commands/command_line.py) calls it before Hydra composes anything,
    so neither Hydra's "Could not find 'logger'" nor a process group comes first.
    """
    for arg in argv:
        match = _OVERRIDE_KEY.match(arg)
        new = RENAMED_GROUPS.get(match.group(1)) if match else None
        if new is not None:
            old = match.group(1)
            fixed = arg[:match.start(1)] + new + arg[match.end(1):]
            raise UserError(f"{arg}: {_RENAMED_HINTS.get(new, f'the config group is now `{new}`')}; "
                            f"rename {old}... to {new}... (here: {fixed})")
