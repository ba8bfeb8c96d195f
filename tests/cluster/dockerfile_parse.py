"""A minimal Dockerfile reader for the static checks: instructions with their arguments, in order.

No Docker engine runs in CI, so the image is checked by reading its recipe. Only what the checks
need is handled: line continuations, comment lines (also inside continuations, which Docker drops)
and the JSON (exec) form of ENTRYPOINT/CMD.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction: keyword (upper case), raw argument text, 1-based first line."""

    keyword: str
    args: str
    line: int

    def exec_form(self) -> list[str] | None:
        """The argument list when written in JSON exec form (["a", "b"]), else None."""
        text = self.args.strip()
        if not text.startswith("["):
            return None
        value = json.loads(text)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"line {self.line}: {self.keyword} JSON form must be a list of strings")
        return value


def parse_dockerfile(path: Path) -> list[Instruction]:
    """The instructions of the Dockerfile at `path`, continuations joined, comments dropped."""
    instructions: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        text = " ".join(part for part in pending if part)
        pending = []
        keyword, _, args = text.partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip(), start))
    if pending:
        raise ValueError(f"{path}: the file ends inside a line continuation started at line {start}")
    return instructions


def arg_defaults(instructions: list[Instruction]) -> dict[str, str]:
    """ARG name -> default value (empty string when the ARG has none)."""
    defaults: dict[str, str] = {}
    for ins in instructions:
        if ins.keyword != "ARG":
            continue
        name, _, value = ins.args.partition("=")
        defaults[name.strip()] = shlex.split(value)[0] if value.strip() else ""
    return defaults
