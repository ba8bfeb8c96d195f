"""The `python`/`torchrun` commands of train.py, evaluate.py, predict.py and export.py that README.md and docs/*.md show.

Commands are read from fenced code blocks (continuation lines joined, comments dropped) and kept with the file
and line they come from, so a failing one names the line a user would copy.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SCRIPTS = ("train.py", "evaluate.py", "predict.py", "export.py")
LAUNCHER = re.compile(r"(?:^|\s)((?:\S*/)?(?:python3?|torchrun)\s.*)$")


@dataclass(frozen=True)
class DocCommand:
    """One documented command: where it is written, and its words after the script name."""

    where: str          # "docs/data.md:63"
    text: str           # the command as written (continuations joined)
    launcher: str       # "python" or "torchrun"
    script: str         # "train.py" | "evaluate.py" | "predict.py"
    args: tuple[str, ...]

    @property
    def multirun(self) -> bool:
        """Whether the command asks Hydra for a sweep (`-m` / `--multirun`)."""
        return "-m" in self.args or "--multirun" in self.args

    def value(self, key: str) -> str | None:
        """The last value given for `key=` (Hydra keeps the last), or None."""
        found = None
        for arg in self.args:
            if arg.split("=", 1)[0].lstrip("+~") == key and "=" in arg:
                found = arg.split("=", 1)[1]
        return found


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every fenced code line, continuation lines joined onto the first."""
    out, inside, pending, start = [], False, "", 0
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip().startswith("```"):
            inside, pending = not inside, ""
            continue
        if not inside:
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append((start, pending + line))
        pending = ""
    return out


def parse(where: str, line: str) -> DocCommand | None:
    """The command on one code line, or None when the line runs none of the three scripts."""
    match = LAUNCHER.search(line)
    if not match:
        return None
    try:
        words = shlex.split(match.group(1), comments=True)
    except ValueError:
        return None
    script_at = next((i for i, w in enumerate(words) if Path(w).name in SCRIPTS), None)
    if script_at is None:
        return None
    launcher = "torchrun" if Path(words[0]).name == "torchrun" else "python"
    return DocCommand(where, " ".join(words), launcher, Path(words[script_at]).name, tuple(words[script_at + 1:]))


def documented_commands() -> list[DocCommand]:
    """Every documented command of the three scripts, in file order."""
    found = []
    for path in DOC_FILES:
        for number, line in _logical_lines(path.read_text()):
            command = parse(f"{path.relative_to(REPO)}:{number}", line)
            if command is not None:
                found.append(command)
    return found
