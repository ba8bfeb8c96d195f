"""The reference check of a new project: nothing it keeps may import, test, run or document what it left out.

`check(before, after)` compares the template's files (`before`: path -> text) with the new project's (`after`,
markers already stripped) and returns one Finding per line of a kept file that refers to something of the
template the project does not have:
- a path (`scripts/slurm/train.sbatch`, `docs/segmentation.md`, a glob, `REPO / "scripts" / "k8s"`, a
  top-level file such as `Dockerfile`) and Markdown links, relative ones included, with their `#anchor`;
- a Python module (`src.data.datasets.voc`, `from src.models import deeplab`);
- a config name whose conf/<group>/<name>.yaml was left out (`data=voc`, `- override /model: deeplabv3_resnet50`,
  `experiment=...`, sweeps `model=a,b`);
- a name registered (`@MODELS.register("deeplabv3plus", ...)`) only by a module that was left out, quoted or as
  `model.name=` / `data.name=`;
- a Makefile target the project's Makefile no longer has (`make gpu-check`);
- a kept src/ module registering a name for a task the project leaves out (`DATASETS.register(..., task="...")`):
  the module belongs to that task's part in project_parts.toml;
- in Python, a name imported from a kept module that no longer defines it (its definition was in a cut region),
  and a pytest fixture whose every definition was left out, requested by a kept test or fixture.
Kept Python files must also still compile (a marker region cut through a statement).
"""
from __future__ import annotations

import ast
import posixpath
import re
from dataclasses import dataclass
from typing import Iterable, Iterator

from scripts.project_parts import matches

ROOTS = ("src", "scripts", "conf", "tests", "docs", "csrc", ".ci")
_PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./*-]*[\w*])" % "|".join(re.escape(r) for r in ROOTS))
_JOINED = re.compile(r"""((?:["'][\w.-]+["']\s*/\s*)+["'][\w.-]+["'])""")  # REPO / "scripts" / "k8s"
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_MODULE = re.compile(r"(?<![\w.])((?:src|tests|scripts)(?:\.\w+)+)")
_FROM_IMPORT = re.compile(r"^\s*from\s+((?:src|tests|scripts)(?:\.\w+)*)\s+import\s+\(?([\w\s,]+)")
_CONFIG = re.compile(r"(?<![\w.])[+~]?/?([\w/]+)(?:=|\s*:\s*)([\w-]+(?:,[\w-]+)*)")
_REGISTER = re.compile(r"""\.register\(\s*["']([\w.-]+)["']""")
_MAKE = re.compile(r"(?<![\w-])make\s+([\w-]+)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
SUFFIXES = ("", ".py", ".yaml", ".md")


@dataclass(frozen=True)
class Finding:
    """`file`:`line` refers to `ref`, which is the template's `target` and not the project's."""

    file: str
    line: int
    ref: str
    target: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} -> {self.ref}" + (f" ({self.target})" if self.target != self.ref else "")


def _dirs(files: Iterable[str]) -> set[str]:
    """Every folder that holds one of `files`, at any depth."""
    folders = set()
    for f in files:
        parts = f.split("/")[:-1]
        folders.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    return folders


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading's text."""
    text = re.sub(r"[`*_]|<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"\]\([^)]*\)", "", text).replace("[", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """The anchors of a page's headings (those outside fenced code)."""
    found, fenced = set(), False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (m := _HEADING.match(line)):
            found.add(slug(m.group(2)))
    return found


def make_targets(makefile: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"^([\w-]+)\s*:(?!=)", makefile, re.M)}


def _registered(path: str, text: str) -> list[str]:
    """The `model.name` / `data.name` values a file registers or configures."""
    if path.startswith("src/") and path.endswith(".py"):
        return _REGISTER.findall(text)
    if path.startswith(("conf/model/", "conf/data/")) and path.endswith(".yaml"):
        return re.findall(r"^name:\s*([\w.-]+)\s*$", text, re.M)
    return []


def _defined(tree: ast.Module) -> set[str]:
    """Names a module defines at its top level (also inside top-level if / try blocks)."""
    names: set[str] = set()
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            pending += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                        *(s for h in getattr(node, "handlers", []) for s in h.body)]
    return names


def _fixtures(tree: ast.Module) -> set[str]:
    """Names of the module- and class-level functions decorated as pytest fixtures."""
    nodes = [*tree.body, *(n for c in tree.body if isinstance(c, ast.ClassDef) for n in c.body)]
    return {node.name for node in nodes if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and any("fixture" in ast.unparse(d) for d in node.decorator_list)}


def _parse(text: str) -> ast.Module | SyntaxError:
    try:
        return ast.parse(text)
    except SyntaxError as err:
        return err


class _Index:
    """What the template had and the project has: files, folders, modules, configs, registered names, targets."""

    def __init__(self, before: dict[str, str], after: dict[str, str]) -> None:
        self.before, self.after = before, after
        self.files_before, self.files_after = set(before), set(after)
        self.dirs_before, self.dirs_after = _dirs(before), _dirs(after)
        self.dropped = self.files_before - self.files_after
        self.top_level = sorted(f for f in self.dropped if "/" not in f)
        # conf/<group>/<name>.yaml left out, unless the project still has a file of that name in that group
        self.configs = {(posixpath.dirname(f)[5:], posixpath.basename(f)[:-5]): f for f in self.dropped
                        if f.startswith("conf/") and f.endswith(".yaml") and f.count("/") >= 2}
        # Registered names: literal ones in src/ and, for builders registered in a loop, the `name:` of conf files.
        kept_names = {n for f in self.files_after for n in _registered(f, after[f])}
        self.registered = {n: f for f in sorted(self.dropped) for n in _registered(f, before[f]) if n not in kept_names}
        names = "|".join(re.escape(n) for n in sorted(self.registered, key=len, reverse=True))
        self.name_ref = re.compile(rf"""(?:["'`]|(?<![\w.])(?:model|data)\.name=|^\s*name:\s*)({names})(?:["'`]|(?![\w.-]))""") if names else None
        self.targets_gone = make_targets(before.get("Makefile", "")) - make_targets(after.get("Makefile", ""))
        # Parsed only where needed (parsing every file is most of the check's time): the files the markers
        # changed, the modules they define, and the test files that define fixtures.
        self.changed = {f for f, t in after.items() if before.get(f) != t}
        self._trees: dict[tuple[str, bool], ast.Module | SyntaxError] = {}
        self.syntax_errors = {f: e for f in self.changed if f.endswith(".py")
                              if isinstance(e := self.tree(f, after=True), SyntaxError)}
        # Modules whose names a kept file may have imported and lost: those the markers changed.
        self.changed_modules = {f[:-3].removesuffix("/__init__").replace("/", ".") for f in self.changed
                                if f.endswith(".py")}

        def fixtures(files: dict[str, str], is_after: bool) -> set[str]:
            trees = [self.tree(f, is_after) for f, t in files.items()
                     if f.startswith("tests/") and f.endswith(".py") and "fixture" in t]
            return {n for t in trees if isinstance(t, ast.Module) for n in _fixtures(t)}
        self.fixtures_gone = fixtures(before, False) - fixtures(after, True)
        self.top_level_ref = re.compile(r"(?<![\w./-])(%s)(?![\w-])" % "|".join(map(re.escape, self.top_level))) \
            if self.top_level else None
        self.anchors_before = {f: anchors(t) for f, t in before.items() if f.endswith(".md")}
        self.anchors_after = {f: anchors(t) for f, t in after.items() if f.endswith(".md")}

    def tree(self, path: str, after: bool) -> ast.Module | SyntaxError:
        """The template's (after=False) or the project's parse of a Python file; unchanged files share one."""
        key = (path, after and path in self.changed)
        if key not in self._trees:
            self._trees[key] = _parse((self.after if key[1] else self.before)[path])
        return self._trees[key]

    def module(self, path: str, after: bool) -> ast.Module | None:
        if path not in (self.after if after else self.before):
            return None
        tree = self.tree(path, after)
        return tree if isinstance(tree, ast.Module) else None

    def gone(self, path: str) -> str | None:
        """The template file or folder `path` names (with an implied suffix) when the project lacks it."""
        path = posixpath.normpath(path).rstrip("/")
        if any(c in path for c in "*?["):
            hit = [f for f in self.files_before if matches(f, path)]
            return path if hit and not any(matches(f, path) for f in self.files_after) else None
        for suffix in SUFFIXES:
            candidate = path + suffix
            if candidate in self.files_before or (not suffix and candidate in self.dirs_before):
                present = candidate in self.files_after or candidate in self.dirs_after
                return None if present else candidate
        return None

    def module_gone(self, dotted: str) -> str | None:
        """The file of the deepest template module `dotted` names, when the project lacks it."""
        parts = dotted.split(".")
        for k in range(len(parts), 1, -1):
            stem = "/".join(parts[:k])
            if f"{stem}.py" in self.files_before:
                return None if f"{stem}.py" in self.files_after else f"{stem}.py"
            if stem in self.dirs_before:
                return None if stem in self.dirs_after else stem
        return None


def _line_refs(index: _Index, path: str, line: str) -> Iterator[tuple[str, str]]:
    """(what the line says, the template file or folder it means) for each dangling reference on one line."""
    for m in _PATH.finditer(line):
        # A glob in code is a pattern that may match nothing; in a page it names files the reader should find.
        if "*" in m.group(1) and not path.endswith(".md"):
            continue
        if (target := index.gone(m.group(1))) is not None:
            yield m.group(1), target
    if index.top_level_ref is not None:
        for m in index.top_level_ref.finditer(line):
            yield m.group(1), m.group(1)
    if path.endswith(".py"):
        for m in _JOINED.finditer(line):
            joined = "/".join(re.findall(r"""["']([\w.-]+)["']""", m.group(1)))
            if joined.split("/")[0] in ROOTS and (target := index.gone(joined)) is not None:
                yield joined, target
        if (m := _FROM_IMPORT.match(line)):
            for name in re.findall(r"\w+", m.group(2)):
                if (target := index.module_gone(f"{m.group(1)}.{name}")) is not None:
                    yield f"{m.group(1)}.{name}", target
    for m in _MODULE.finditer(line):
        if (target := index.module_gone(m.group(1))) is not None:
            yield m.group(1), target
    if path.endswith(".md"):
        for m in _LINK.finditer(line):
            link = m.group(1)
            if "://" in link or link.startswith("mailto:"):
                continue
            page, _, anchor = link.partition("#")
            target = posixpath.normpath(posixpath.join(posixpath.dirname(path), page)) if page else path
            if page and (gone := index.gone(target)) is not None:
                yield link, gone
            elif anchor and target in index.anchors_after and anchor in index.anchors_before.get(target, set()) \
                    and anchor not in index.anchors_after[target]:
                yield link, f"{target}#{anchor}"
    for m in _CONFIG.finditer(line):
        group = m.group(1).strip("/")
        for name in m.group(2).split(","):
            if (group, name) in index.configs:
                yield f"{group}={name}", index.configs[(group, name)]
    if index.name_ref is not None:
        for m in index.name_ref.finditer(line):
            yield m.group(1), index.registered[m.group(1)]
    for m in _MAKE.finditer(line):
        if m.group(1) in index.targets_gone:
            yield f"make {m.group(1)}", f"Makefile#{m.group(1)}"


def _python_refs(index: _Index, path: str, tree: ast.Module) -> Iterator[tuple[int, str, str]]:
    """(line, what, where it was) for names imported from kept modules that lost them, and (in tests/) fixtures
    left out."""
    in_tests = path.startswith("tests/")
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            stem = node.module.replace(".", "/")
            module = next((m for m in (f"{stem}.py", f"{stem}/__init__.py") if m in index.after), None)
            if module is None or module not in index.changed:
                continue
            before, after = index.module(module, after=False), index.module(module, after=True)
            if before is None or after is None:
                continue
            had, has = _defined(before), _defined(after)
            for alias in node.names:
                submodule = f"{stem}/{alias.name}"
                if alias.name in had and alias.name not in has and not (
                        f"{submodule}.py" in index.files_after or submodule in index.dirs_after):
                    yield node.lineno, f"{node.module}.{alias.name}", module
        elif in_tests and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for arg in node.args.args:
                if arg.arg in index.fixtures_gone:
                    yield node.lineno, f"fixture {arg.arg}", "a fixture the project left out"
        elif in_tests and isinstance(node, ast.Call) and ast.unparse(node.func).endswith("usefixtures"):
            for arg in node.args:
                if isinstance(arg, ast.Constant) and arg.value in index.fixtures_gone:
                    yield node.lineno, f"fixture {arg.value}", "a fixture the project left out"


def _task_registrations(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, task) of every `<registry>.register(..., task="...")` call (docstring examples are not calls)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "register":
            for keyword in node.keywords:
                if keyword.arg == "task" and isinstance(keyword.value, ast.Constant):
                    yield node.lineno, str(keyword.value.value)


def check(before: dict[str, str], after: dict[str, str], allowed: Iterable[tuple[str, str, str]] = (),
          tasks_left_out: Iterable[str] = ()) -> list[Finding]:
    """Every reference in `after`'s files to what `before` has and `after` lacks, and every registration for one
    of `tasks_left_out` in a kept src/ module, less the `allowed` ones ((file glob, target glob, why) from
    project_parts.toml; a registration's target is `task <name>`)."""
    tasks_left_out = set(tasks_left_out)
    index = _Index(before, after)
    allowed = list(allowed)
    findings: list[Finding] = []
    for path in sorted(after):
        text = after[path]
        found: list[tuple[int, str, str]] = []
        if (err := index.syntax_errors.get(path)) is not None:
            found.append((err.lineno or 0, "does not compile", str(err.msg)))
        if tasks_left_out and path.startswith("src/") and path.endswith(".py") and "register(" in text:
            if (tree := index.module(path, after=True)) is not None:
                found += [(line, f'task="{task}"', f"task {task}") for line, task in _task_registrations(tree)
                          if task in tasks_left_out]
        if path.endswith(".py") and (any(m in text for m in index.changed_modules)
                                     or any(f in text for f in index.fixtures_gone)):
            if (tree := index.module(path, after=True)) is not None:
                found += _python_refs(index, path, tree)
        for number, line in enumerate(text.splitlines(), start=1):
            found += [(number, ref, target) for ref, target in dict.fromkeys(_line_refs(index, path, line))]
        findings += [Finding(path, number, ref, target) for number, ref, target in sorted(set(found))
                     if not any(matches(path, a_in) and matches(target, a_to) for a_in, a_to, _ in allowed)]
    return findings
