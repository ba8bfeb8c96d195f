"""The parts a new project is made of (project_parts.toml) and the files each choice of parts keeps.

A template file is kept when a chosen part claims it, or when no part claims it and `[dropped]` does not
list it (the core). Kept text files then lose the regions marked for parts that were not chosen:

    <!-- part: segmentation -->  ...  <!-- /part -->     Markdown, on lines of their own or inside one line
    # part: segmentation  ...  # /part                   Python, YAML, shell, Makefile, TOML, fenced code
    # part: slurm, docker                                a region kept when any of the parts is chosen

The marker lines themselves never reach a new project. `template` is a part no new project has: regions
that only make sense in the template itself (how to start a project from it) are marked with it.
Used by scripts/new_project.py (which writes the files) and tests/test_new_project.py.
"""
from __future__ import annotations

import fnmatch
import re
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "project_parts.toml"
TEMPLATE_PART = "template"  # regions no new project keeps
KINDS = ("task", "cluster", "tool")

_NAMES = r"[\w-]+(?:\s*,\s*[\w-]+)*"
_START = re.compile(rf"^\s*(?:<!--\s*part:\s*(?P<md>{_NAMES})\s*-->|#\s*part:\s*(?P<hash>{_NAMES}))\s*$")
_END = re.compile(r"^\s*(?:<!--\s*/part\s*-->|#\s*/part)\s*$")
_INLINE = re.compile(rf"<!--\s*part:\s*(?P<names>{_NAMES})\s*-->(?P<body>.*?)<!--\s*/part\s*-->")
_LOOSE = re.compile(r"<!--\s*/?part\b|#\s*part:|#\s*/part\b")  # a marker the rules above did not take


class ManifestError(ValueError):
    """project_parts.toml, a marker or a choice of parts is wrong; the message says where and how."""


@dataclass(frozen=True)
class Part:
    """One optional piece of the template: the files it owns and the parts it cannot go without."""

    name: str
    kind: str                     # "task" (--tasks), "cluster" (--cluster) or "tool" (its own flag)
    about: str
    paths: tuple[str, ...]        # globs relative to the repository root
    requires: tuple[str, ...] = ()
    required: bool = False        # every project has it (a task the default job needs)


@dataclass(frozen=True)
class Manifest:
    """project_parts.toml, read and checked."""

    parts: dict[str, Part]
    dropped: tuple[str, ...]                   # globs no project gets unless a chosen part claims the file
    task_paths: tuple[str, ...]                # "{task}" globs every task part claims as well
    allowed: tuple[tuple[str, str, str], ...]  # (file glob, referred glob, why) the reference check accepts

    def of_kind(self, kind: str) -> list[str]:
        return [name for name, part in self.parts.items() if part.kind == kind]

    def globs(self, part: Part) -> tuple[str, ...]:
        """The part's own globs, and for a task the per-task ones (src/tasks/<task>.py, ...)."""
        extra = tuple(g.format(task=part.name) for g in self.task_paths) if part.kind == "task" else ()
        return part.paths + extra


def _strings(table: dict, key: str, where: str) -> tuple[str, ...]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ManifestError(f"project_parts.toml: {where}.{key} must be a list of strings")
    return tuple(value)


def load_manifest(path: Path = MANIFEST) -> Manifest:
    """Read project_parts.toml; ManifestError naming the table and key that is wrong."""
    data = tomllib.loads(path.read_text())
    parts: dict[str, Part] = {}
    for name, table in data.get("parts", {}).items():
        if name == TEMPLATE_PART:
            raise ManifestError(f"project_parts.toml: [parts.{name}]: '{TEMPLATE_PART}' is reserved for template-only regions")
        if table.get("kind") not in KINDS:
            raise ManifestError(f"project_parts.toml: [parts.{name}] kind must be one of {KINDS}, got {table.get('kind')!r}")
        parts[name] = Part(name, table["kind"], str(table.get("about", "")), _strings(table, "paths", f"[parts.{name}]"),
                           _strings(table, "requires", f"[parts.{name}]"), bool(table.get("required", False)))
    for part in parts.values():
        unknown = [r for r in part.requires if r not in parts]
        if unknown:
            raise ManifestError(f"project_parts.toml: [parts.{part.name}] requires unknown parts {unknown}")
    if len([p for p in parts.values() if p.kind == "tool"]) > 1:
        raise ManifestError("project_parts.toml: new_project.py has one flag for the one part of kind 'tool'")
    allowed = []
    for i, entry in enumerate(data.get("allowed", [])):
        if not all(isinstance(entry.get(k), str) and entry.get(k) for k in ("in", "to", "why")):
            raise ManifestError(f"project_parts.toml: [[allowed]] entry {i + 1} needs `in`, `to` and `why` strings")
        allowed.append((entry["in"], entry["to"], entry["why"]))
    return Manifest(parts, _strings(data.get("dropped", {}), "paths", "[dropped]"),
                    _strings(data.get("task_paths", {}), "paths", "[task_paths]"), tuple(allowed))


def resolve(manifest: Manifest, chosen: set[str]) -> set[str]:
    """The chosen parts with the required ones and everything they require; ManifestError for unknown names."""
    unknown = sorted(chosen - set(manifest.parts))
    if unknown:
        raise ManifestError(f"unknown parts {unknown}; the parts are {sorted(manifest.parts)}")
    result = set(chosen) | {n for n, p in manifest.parts.items() if p.required}
    pending = list(result)
    while pending:
        for needed in manifest.parts[pending.pop()].requires:
            if needed not in result:
                result.add(needed)
                pending.append(needed)
    return result


def matches(path: str, pattern: str) -> bool:
    """Whether repository path `path` is `pattern` (a glob: `*` and `**` span folders, `{a,b}` is a or b) or lies
    under the folder it names."""
    if (brace := re.search(r"\{([^{}]*)\}", pattern)):
        return any(matches(path, pattern[:brace.start()] + choice + pattern[brace.end():])
                   for choice in brace.group(1).split(","))
    if "*" not in pattern and "?" not in pattern and "[" not in pattern:
        return path == pattern or path.startswith(pattern.rstrip("/") + "/")
    return fnmatch.fnmatchcase(path, pattern) or fnmatch.fnmatchcase(path, pattern.replace("**/", ""))


def template_files(root: Path = REPO) -> list[str]:
    """The template's files: those git tracks, as they are in the working tree (never .venv, builds, runs or
    scratch files nobody added)."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached"],
                             capture_output=True, check=True).stdout.decode()
    except (OSError, subprocess.CalledProcessError) as err:
        raise ManifestError(f"{root} must be a git checkout of the template (git ls-files failed: {err})") from None
    return sorted({p for p in out.split("\0") if p and (root / p).is_file() and not (root / p).is_symlink()})


@dataclass
class Selection:
    """Which template files a choice of parts keeps, and which it leaves out (with the reason)."""

    parts: set[str]
    kept: list[str] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)  # path -> "part segmentation" | "template only"


def select(manifest: Manifest, files: list[str], parts: set[str]) -> Selection:
    """Split `files` by the chosen `parts` (already resolved)."""
    selection = Selection(parts)
    owners = {name: manifest.globs(part) for name, part in manifest.parts.items()}
    for path in files:
        claimed_by = [name for name, globs in owners.items() if any(matches(path, g) for g in globs)]
        if any(name in parts for name in claimed_by):
            selection.kept.append(path)
        elif claimed_by:
            selection.dropped[path] = "part " + ", ".join(claimed_by)
        elif any(matches(path, g) for g in manifest.dropped):
            selection.dropped[path] = "template only"
        else:
            selection.kept.append(path)
    return selection


def unmatched_globs(manifest: Manifest, files: list[str]) -> list[str]:
    """Globs of the manifest that name no file (a renamed or deleted file the manifest still lists)."""
    stale = []
    for where, globs in [*((f"[parts.{n}]", p.paths) for n, p in manifest.parts.items()), ("[dropped]", manifest.dropped)]:
        stale += [f"{where} {g}" for g in globs if not any(matches(f, g) for f in files)]
    return stale


def strip_markers(text: str, parts: set[str], known: set[str], where: str) -> str:
    """`text` without the regions of parts not in `parts` and without any marker; ManifestError (file:line)
    for an unknown part name, an unclosed region or a stray closing marker."""
    def active(names: str, line: int) -> bool:
        listed = {n.strip() for n in names.split(",")}
        unknown = sorted(listed - known - {TEMPLATE_PART})
        if unknown:
            raise ManifestError(f"{where}:{line}: marker names unknown parts {unknown} (known: {sorted(known)})")
        return bool(listed & parts)

    out: list[str | None] = []  # None: where a region was cut
    stack: list[tuple[int, bool]] = []  # (line of the opening marker, region kept)
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        start, end = _START.match(line), _END.match(line)
        if start:
            stack.append((number, active(start.group("md") or start.group("hash"), number)))
            continue
        if end:
            if not stack:
                raise ManifestError(f"{where}:{number}: a closing part marker without an opening one")
            if not stack.pop()[1]:
                out.append(None)
            continue
        if not all(kept for _, kept in stack):
            continue
        cut = _INLINE.sub(lambda m: m.group("body") if active(m.group("names"), number) else "", line)
        if cut != line and not cut.replace("|", "").strip(" \t\n-*"):
            continue  # a Markdown table row or list item (or line) that held only a cut region
        line = cut
        if _LOOSE.search(line):
            raise ManifestError(f"{where}:{number}: a part marker must stand on a line of its own "
                                f"(or, in Markdown, open and close inside one line): {line.strip()!r}")
        out.append(line)
    if stack:
        raise ManifestError(f"{where}:{stack[-1][0]}: part marker not closed")
    return _close_gaps(out)


def _close_gaps(lines: list[str | None]) -> str:
    """Join the kept lines; where a region was cut (None), the blank lines on its two sides become as many as
    the longer side had (two between Python functions stay two), and none at the end of the file."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line is not None:
            out.append(line)
            i += 1
            continue
        before = 0
        while before < len(out) and not out[len(out) - 1 - before].strip():
            before += 1
        j, after = i, 0
        while j < len(lines) and (lines[j] is None or not lines[j].strip()):
            after += lines[j] is not None
            j += 1
        keep = 0 if j == len(lines) or before == len(out) else max(before, after)
        del out[len(out) - before:]
        out.extend(["\n"] * keep)
        i = j
    return "".join(out)
