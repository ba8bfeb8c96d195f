"""The torch.* / torchvision.* names this project's code uses, and which of them the oldest supported PyTorch has.

    python scripts/torch_api_names.py                     # every use: file:line, name, guarded or not
    .venv-compat/bin/python scripts/torch_api_names.py --write tests/oldest_torch_api.txt

Read off the source (no import of the code): every attribute chain rooted at `torch` or `torchvision`
(`torch.distributed.set_timeout`, `F.interpolate` after `import torch.nn.functional as F`,
`from torch.distributed import set_timeout`), and every keyword argument passed to one
(`torch.nn.parallel.DistributedDataParallel(forward_sync_buffers=)`; one without a readable signature, a
builtin, counts as accepted) in src/, scripts/, the entry points and every repository file
that `make gpu-check` runs (scripts/gpu_imports.py's reading of its path: the test files of
scripts/gpu_check_tests.txt, their conftest.py files and the helpers they import). A use is *guarded* when
the code already copes with the name missing:

- `hasattr(X, "n")` and `getattr(X, "n", default)` themselves, and code that runs only when such a test
  holds (`if hasattr(...)`, its `else` under `not`, `hasattr(...) and ...`, a module-level flag assigned
  from one, `pytest.mark.skipif(not hasattr(...))` on a test);
- code under a PyTorch version test (`if` on `torch.__version__` or on a module-level name computed from it,
  both branches), and a keyword argument under `"k" in inspect.signature(f).parameters` (or a flag of it);
- code inside `try:` with a handler for AttributeError or ImportError (named: a broad `except Exception`
  that reports any failure is no fallback).

`--write FILE`, run with the oldest supported PyTorch (the environment of `make test-compat`, which does it),
resolves every name used and each of its prefixes in that PyTorch and writes them, one a line, those it
lacks marked `missing`: the snapshot that tests/test_oldest_torch_api.py checks the code against in
`make test`, without that PyTorch.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import gpu_imports  # noqa: E402 - a sibling script, found through the line above

ROOTS = ("torch", "torchvision")
ENTRY_POINTS = ("train.py", "evaluate.py", "predict.py", "export.py")
ALL = "*"  # a guard that covers every name (a version test, a try/except)
MISSING = "missing "
# A handler for one of these is a fallback for a missing name. A broader one (`except Exception:` reporting
# whatever went wrong) is not counted: it would hide a missing name as some other failure.
_CATCHING = {"AttributeError", "ImportError", "ModuleNotFoundError"}


@dataclass(frozen=True)
class Use:
    """One use of a name: where, which, and the names whose absence the code copes with there (ALL: any)."""

    path: str
    line: int
    name: str
    guards: frozenset[str]

    def copes_without(self, name: str) -> bool:
        """Whether this use copes with `name` (the use's name or one of its prefixes) missing."""
        return ALL in self.guards or name in self.guards


def source_files() -> list[Path]:
    """src/, scripts/, the entry points and the gpu-check path's files: each once, sorted."""
    files = {*(REPO / "src").rglob("*.py"), *(REPO / "scripts").rglob("*.py"),
             *(REPO / f for f in ENTRY_POINTS if (REPO / f).is_file()), *gpu_imports.gpu_check_files()}
    return sorted(files)


def _bindings(tree: ast.Module) -> dict[str, str]:
    """local name -> the torch/torchvision name an import statement (anywhere in the file) binds it to."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in ROOTS:
                    if alias.asname:
                        out[alias.asname] = alias.name
                    else:
                        out[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in ROOTS:
            for alias in node.names:
                if alias.name != "*":
                    out[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return out


class _Reader(ast.NodeVisitor):
    """Walks one file, tracking the guards around each node."""

    def __init__(self, path: str, bindings: dict[str, str], flags: dict[str, tuple[frozenset, frozenset]],
                 versions: set[str]) -> None:
        self.path, self.bindings, self.flags, self.versions = path, bindings, flags, versions
        self.guards: list[frozenset[str]] = []  # what the enclosing tests, try blocks and decorators cover
        self.uses: list[Use] = []

    # --- names --------------------------------------------------------------------------------------------
    def chain(self, node: ast.AST) -> str | None:
        """`torch.a.b` for an expression that is an imported torch/torchvision name followed by attributes."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in self.bindings:
            return ".".join([self.bindings[node.id], *reversed(parts)])
        return None

    def use(self, node: ast.AST, name: str, guarded: bool = False) -> None:
        guards = frozenset().union(*self.guards) | ({name} if guarded else set())
        self.uses.append(Use(self.path, node.lineno, name, guards))

    # --- what a test tells: (names present when it holds, names present when it fails) ----------------------
    def tells(self, test: ast.AST) -> tuple[frozenset[str], frozenset[str]]:
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            true, false = self.tells(test.operand)
            return false, true
        if isinstance(test, ast.BoolOp):
            told = [self.tells(v) for v in test.values]
            if isinstance(test.op, ast.And):
                return frozenset().union(*(t for t, _ in told)), frozenset()
            return frozenset(), frozenset().union(*(f for _, f in told))
        if isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and (
                test.func.id == "hasattr" or (test.func.id == "getattr" and len(test.args) == 3)):
            name = self._attr_arg(test)  # getattr(X, "n", None) as a test: true only where X.n exists
            return (frozenset({name}), frozenset()) if name else (frozenset(), frozenset())
        if isinstance(test, ast.Name) and test.id in self.flags:
            return self.flags[test.id]
        if (keyword := self._signature_test(test)) is not None:
            return frozenset({keyword}), frozenset()
        if _mentions_version(test, self.versions):
            return frozenset({ALL}), frozenset({ALL})
        return frozenset(), frozenset()

    def _signature_test(self, test: ast.AST) -> str | None:
        """`torch.a.f(k=)` for the test `"k" in inspect.signature(torch.a.f).parameters` (`f.__init__` alike)."""
        if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.In)
                and isinstance(test.left, ast.Constant) and isinstance(test.left.value, str)):
            return None
        params = test.comparators[0]
        if not (isinstance(params, ast.Attribute) and params.attr == "parameters" and isinstance(params.value, ast.Call)
                and isinstance(params.value.func, (ast.Attribute, ast.Name)) and params.value.args):
            return None
        func = params.value.func
        if (func.attr if isinstance(func, ast.Attribute) else func.id) != "signature":
            return None
        callee = self.chain(params.value.args[0])
        return f"{callee.removesuffix('.__init__')}({test.left.value}=)" if callee else None

    def _attr_arg(self, call: ast.Call) -> str | None:
        """`torch.a.n` for hasattr/getattr(torch.a, "n", ...)."""
        if len(call.args) >= 2 and isinstance(call.args[1], ast.Constant) and isinstance(call.args[1].value, str):
            base = self.chain(call.args[0])
            return f"{base}.{call.args[1].value}" if base else None
        return None

    def guarded_visit(self, nodes: list[ast.AST] | ast.AST, names: frozenset[str]) -> None:
        self.guards.append(names)
        for node in nodes if isinstance(nodes, list) else [nodes]:
            self.visit(node)
        self.guards.pop()

    # --- the visitors ---------------------------------------------------------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] in ROOTS and "." in alias.name:
                self.use(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if not node.level and (node.module or "").split(".")[0] in ROOTS:
            for alias in node.names:
                if alias.name != "*":
                    self.use(node, f"{node.module}.{alias.name}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        name = self.chain(node)
        if name is None:
            self.generic_visit(node)
        elif isinstance(node.ctx, ast.Load):
            self.use(node, name)
        elif name.count(".") > 1:  # assigning or deleting `a.b.c` needs `a.b` only
            self.use(node, name.rpartition(".")[0])

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("hasattr", "getattr") and (name := self._attr_arg(node)):
            # hasattr and getattr with a default cope with a missing name; getattr without one does not
            self.use(node, name, guarded=func.id == "hasattr" or len(node.args) == 3)
            for arg in (node.args[0], *node.args[2:]):  # the object asked (torch.a of torch.a.n) must exist
                self.visit(arg)
            return
        if (callee := self.chain(func)) is not None:
            for keyword in node.keywords:  # a keyword argument is a name too: `torch.a.f(k=)`
                if keyword.arg is not None:
                    self.use(node, f"{callee}({keyword.arg}=)")
        self.generic_visit(node)

    def visit_If(self, node: ast.If) -> None:
        if isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            return  # annotations only
        self.visit(node.test)
        true, false = self.tells(node.test)
        self.guarded_visit(node.body, true)
        self.guarded_visit(node.orelse, false)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self.visit(node.test)
        true, false = self.tells(node.test)
        self.guarded_visit(node.body, true)
        self.guarded_visit(node.orelse, false)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        told: frozenset[str] = frozenset()
        for value in node.values:
            self.guarded_visit(value, told)
            true, false = self.tells(value)
            told |= true if isinstance(node.op, ast.And) else false

    def visit_Try(self, node: ast.Try) -> None:
        catches = any(h.type is not None and _names(h.type) & _CATCHING for h in node.handlers)
        self.guarded_visit(node.body, frozenset({ALL}) if catches else frozenset())
        for part in (*node.handlers, *node.orelse, *node.finalbody):
            self.visit(part)

    visit_TryStar = visit_Try

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        told: frozenset[str] = frozenset()
        for deco in node.decorator_list:
            self.visit(deco)
            # @pytest.mark.skipif(COND, ...): the test runs only where COND is false
            if isinstance(deco, ast.Call) and isinstance(deco.func, ast.Attribute) and deco.func.attr == "skipif" \
                    and deco.args:
                told |= self.tells(deco.args[0])[1]
        for part in (node.args, *([node.returns] if node.returns else [])):
            self.visit(part)
        self.guarded_visit(node.body, told)

    visit_AsyncFunctionDef = visit_FunctionDef


def _names(node: ast.AST) -> set[str]:
    """The bare names of an exception type expression (`(AttributeError, RuntimeError)` -> both)."""
    if isinstance(node, ast.Tuple):
        return set().union(*(_names(e) for e in node.elts))
    if isinstance(node, ast.Attribute):
        return {node.attr}
    return {node.id} if isinstance(node, ast.Name) else set()


def _mentions_version(node: ast.AST, versions: set[str]) -> bool:
    """An expression that reads PyTorch's (or torchvision's) version, directly or through a module-level name."""
    return any((isinstance(n, ast.Attribute) and n.attr == "__version__")
               or (isinstance(n, ast.Name) and n.id in versions) for n in ast.walk(node))


def _module_flags(tree: ast.Module, reader: _Reader) -> None:
    """Module-level names assigned from a version or hasattr test (`_TORCH = ...__version__...`,
    `HAS_X = hasattr(torch, "x")`), so that tests on them count as guards."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target = node.targets[0].id
            if _mentions_version(node.value, reader.versions):
                reader.versions.add(target)
            else:
                told = reader.tells(node.value)
                if told != (frozenset(), frozenset()):
                    reader.flags[target] = told


def tree_uses(tree: ast.Module, label: str) -> list[Use]:
    """Every use of a torch/torchvision name in the syntax tree of file `label`, in source order."""
    reader = _Reader(label, _bindings(tree), {}, set())
    _module_flags(tree, reader)
    reader.visit(tree)
    return reader.uses


def source_uses(text: str, label: str) -> list[Use]:
    """tree_uses of the Python source `text`."""
    return tree_uses(ast.parse(text, label), label)


def uses() -> list[Use]:
    """Every use in source_files()."""
    return [use for path in source_files() for use in tree_uses(gpu_imports.parsed(path), str(path.relative_to(REPO)))]


def prefixes(name: str) -> list[str]:
    """`torch.a.f(k=)` -> [`torch.a`, `torch.a.f`, `torch.a.f(k=)`]: each name a use needs, below the root module."""
    base, call, _ = name.partition("(")
    parts = base.split(".")
    return [".".join(parts[:k]) for k in range(2, len(parts) + 1)] + ([name] if call else [])


_MISSING = object()


def _resolve(name: str) -> Any:
    """The object `name` is in the PyTorch/torchvision this interpreter imports (submodules imported as needed),
    or _MISSING."""
    parts = name.split(".")
    try:
        obj = importlib.import_module(parts[0])
    except ImportError:
        return _MISSING
    for k in range(1, len(parts)):
        try:
            obj = getattr(obj, parts[k])
        except Exception:  # noqa: BLE001 - a lazy attribute may raise anything; then try it as a submodule
            try:
                obj = importlib.import_module(".".join(parts[: k + 1]))
            except Exception:  # noqa: BLE001 - a submodule that fails to import is missing here too
                return _MISSING
    return obj


def resolves(name: str) -> bool:
    """Whether `name` exists here: an attribute chain, or `f(k=)`, a keyword argument that callable `f` accepts
    (one without a readable signature, a builtin, is taken to accept it)."""
    base, _, keyword = name.partition("(")
    obj = _resolve(base)
    if obj is _MISSING or not keyword:
        return obj is not _MISSING
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return True
    return keyword.removesuffix("=)") in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def read_snapshot(path: Path) -> tuple[str, dict[str, bool]]:
    """(the PyTorch it was written with, as its first line says; name -> whether that PyTorch has it)."""
    lines = path.read_text().splitlines()
    names = {line.removeprefix(MISSING): not line.startswith(MISSING)
             for line in lines if line and not line.startswith("#")}
    return lines[0].removeprefix("# ").split(" (")[0], names


def lacking(found: list[Use], snapshot: dict[str, bool], exists_here: Callable[[str], bool]) -> list[str]:
    """What `found` needs that the snapshot's PyTorch lacks, or that the snapshot does not know, where the code
    does not cope with it missing: one line per use, naming the first such prefix.

    A name that `exists_here` (this interpreter's PyTorch) lacks too is no version question (an op namespace
    filled at run time, an attribute of an object made at run time) and is left alone."""
    out = []
    for use in found:
        for name in prefixes(use.name):
            has = snapshot.get(name)
            if has is True:
                continue
            if not use.copes_without(name) and exists_here(name):
                why = "not in the snapshot" if has is None else "missing there"
                out.append(f"{use.path}:{use.line}: {name} ({why})")
            break
    return out


def write_snapshot(path: Path) -> tuple[int, int]:
    """Resolve every name used (and its prefixes) here and write the snapshot; (names, missing)."""
    import torch
    import torchvision

    names = sorted({p for use in uses() for p in prefixes(use.name)})
    have = {name: resolves(name) for name in names}
    py = platform.python_version()
    lines = [f"# torch {torch.__version__}, torchvision {torchvision.__version__} (Python {py}): the torch.* and",
             "# torchvision.* names this project's code uses, each prefixed `missing` where that PyTorch lacks it.",
             "# Written by `make test-compat` (scripts/torch_api_names.py --write, with that PyTorch); read by",
             "# tests/test_oldest_torch_api.py.",
             *(name if ok else MISSING + name for name, ok in have.items())]
    path.write_text("\n".join(lines) + "\n")
    return len(names), sum(not ok for ok in have.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", type=Path, metavar="FILE", help="resolve the names with this interpreter's "
                        "PyTorch and write them to FILE (the snapshot)")
    args = parser.parse_args(argv)
    if args.write:
        total, missing = write_snapshot(args.write)
        print(f"{args.write}: {total} names, {missing} missing in this PyTorch")
        return 0
    for use in uses():
        guarded = [p for p in prefixes(use.name) if use.copes_without(p)]
        print(f"{use.path}:{use.line}: {use.name}" + (f"  (copes without {guarded[0]})" if guarded else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
