"""Imports run one way, down README's layers (its "Layout"), and no modules import each other in a circle."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# README's layers, top first; a module in none of them (src/'s shared top-level modules) is not checked for direction.
LAYERS = (("src.commands",), ("src.engine",), ("src.config",), ("src.tasks",), ("src.evaluation",),
          ("src.data", "src.models"), ("src.syncbn", "src.comm"))


def _module(path: Path) -> str:
    name = ".".join(path.relative_to(REPO).with_suffix("").parts)
    return name.removesuffix(".__init__")


def _layer(module: str) -> int | None:
    return next((i for i, names in enumerate(LAYERS) for n in names if module == n or module.startswith(n + ".")),
                None)


def _imports(modules: set[str], path: Path) -> list[tuple[str, int]]:
    """The src modules `path` imports (anywhere in it: a function's import counts too), with their lines."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "src"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "src":
            found += [(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module, node.lineno)
                      for a in node.names]
    return found


def _graph() -> dict[str, list[tuple[str, int]]]:
    paths = {_module(p): p for p in REPO.glob("src/**/*.py")}
    return {name: _imports(set(paths), path) for name, path in paths.items()}


def upward_imports(graph: dict[str, list[tuple[str, int]]]) -> list[str]:
    """'a:line -> b' for every import of a module in a higher layer than the importer's."""
    return [f"{a}:{line} -> {b}" for a, targets in graph.items() for b, line in targets
            if _layer(a) is not None and _layer(b) is not None and _layer(b) < _layer(a)]


def circles(graph: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    """Groups of modules that import each other, directly or through others (Tarjan's strongly connected sets).
    A package's __init__ that re-exports its modules is not a circle with them: a module's own package is left out
    of its edges, as Python has imported it first."""
    edges = {a: sorted({b for b, _ in targets if b in graph and not a.startswith(b + ".")})
             for a, targets in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_imports_run_down_the_layers_without_circles() -> None:
    graph = _graph()
    assert {"src.evaluation.loop", "src.config.validation", "src.tasks.base"} <= set(graph)
    assert not upward_imports(graph), "\n".join(upward_imports(graph))
    assert not circles(graph), circles(graph)


def test_the_checks_find_an_upward_import_and_a_circle() -> None:
    graph = {"src.evaluation.loop": [("src.tasks.registry", 3)], "src.tasks.registry": [("src.evaluation.loop", 5)],
             "src.data.bundle": [("src.syncbn.groups", 1)]}
    assert upward_imports(graph) == ["src.evaluation.loop:3 -> src.tasks.registry"]
    assert circles(graph) == [["src.evaluation.loop", "src.tasks.registry"]]
