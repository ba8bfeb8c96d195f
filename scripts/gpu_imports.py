"""What `make gpu-check` imports: the repository files it runs and the third-party distributions they need.

    python scripts/gpu_imports.py                  # the distributions, and which the GPU node lacks
    python scripts/gpu_imports.py --node-like      # name==version of what is installed here and on the node
    python scripts/gpu_imports.py --unimportable   # the modules this Python cannot import (gpu_check.sh's preflight)

Read from the source, not by running it (nothing here needs torch or a GPU): the files scripts/gpu_check.sh
runs (ROOT_FILES, ROOT_MODULES and the test files of scripts/gpu_check_tests.txt), then every repository
module they import, at any depth, as the interpreter would find it. A third-party import counts when it
runs at import time (module level, `try`/`if` blocks included, `if TYPE_CHECKING:` not): one inside a
function only runs on that function's path, and the run-time check (tests/test_gpu_bundle.py: imports the
path's modules and trains a step, then reads sys.modules) says whether any such one is on the gpu-check
path. Each top-level module is mapped to its distribution through this environment's installed metadata,
and the distributions' own requirements are followed (markers read for the GPU node's Python), stopping
at what the node has (GPU_NODE_PACKAGES): its packages come with theirs.
scripts/gpu_bundle.py downloads what is left.
"""
from __future__ import annotations

import argparse
import ast
import functools
import importlib.metadata as md
import importlib.util
import re
import sys
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[1]
TEST_LIST = REPO / "scripts" / "gpu_check_tests.txt"
GPU_NODE_PACKAGES = REPO / "scripts" / "gpu_node_packages.txt"
# What scripts/gpu_check.sh runs besides the test files: scripts by path, modules by `-m`/`-c`, and train.py
# (scripts/gpu_train_compare.py starts it under torchrun). A script that is absent (a step that reports it
# missing) is left out.
ROOT_FILES = ("scripts/gpu_check_probe.py", "scripts/gpu_check_report.py", "scripts/gpu_imports.py",
              "scripts/gpu_occupancy.py", "scripts/bench_exchange_host.py", "scripts/bench_syncbn_cuda.py",
              "scripts/bench_loader.py", "scripts/gpu_train_compare.py", "train.py")
ROOT_MODULES = ("src.syncbn.extension", "src.syncbn.selfcheck", "pytest", "pytest_timeout", "torch.distributed.run",
                "pip")  # pip installs the carried wheels
# Distributions gpu_check.sh needs for a program rather than an import: ninja drives the extension's build.
TOOLS = ("ninja",)
# The GPU node's Python: environment markers of requirements are evaluated for it.
NODE_ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
            "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}


def normalize(name: str) -> str:
    """A distribution's name as the package index compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def gpu_check_test_files() -> dict[str, list[str]]:
    """step -> test files, from scripts/gpu_check_tests.txt (comments and part markers skipped)."""
    steps: dict[str, list[str]] = {}
    for line in TEST_LIST.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            step, path = line.split()
            steps.setdefault(step, []).append(path)
    return steps


def _module_file(name: str, search: list[Path]) -> Path | None:
    """The repository file that `import name` runs, looking in `search` (the script's folder, the repo)."""
    parts = name.split(".")
    for base in search:
        for candidate in (base.joinpath(*parts).with_suffix(".py"), base.joinpath(*parts, "__init__.py")):
            if candidate.is_file() and REPO in candidate.resolve().parents:
                return candidate
    return None


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


@functools.lru_cache(maxsize=None)
def parsed(path: Path) -> ast.Module:
    """The syntax tree of a repository file, read once per process (scripts/torch_api_names.py reads them too)."""
    return ast.parse(path.read_text(), str(path))


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(absolute module name, at import time?) for every import statement of `path`; `from X import y` gives
    both X.y (in case y is a module) and X."""
    tree = parsed(path)
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    out: list[tuple[str, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child, top)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            top = False
        if isinstance(node, ast.Import):
            out.extend((alias.name, top) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".") if package else []
                anchor = anchor[: len(anchor) - (node.level - 1)] if node.level > 1 else anchor
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            out.extend((f"{base}.{alias.name}" if base else alias.name, top) for alias in node.names)
            out.append((base, top))
        # pkgutil.iter_modules(__path__): the package imports every module in its folder (src/models does)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "iter_modules"
                and path.name == "__init__.py"):
            out.extend((f"{package}.{p.stem}", top) for p in sorted(path.parent.glob("*.py")) if p.stem != "__init__")
        for child in ast.iter_child_nodes(node):
            visit(child, top)

    visit(tree, True)
    return [(name, top) for name, top in out if name]


def root_files() -> list[Path]:
    """The files gpu_check.sh runs directly: ROOT_FILES that exist, the test files, their conftest.py files."""
    files = [REPO / f for f in ROOT_FILES if (REPO / f).is_file()]
    for paths in gpu_check_test_files().values():
        for rel in paths:
            files.append(REPO / rel)
            for folder in (REPO / rel).parents:
                if folder == REPO:
                    break
                if (folder / "conftest.py").is_file():
                    files.append(folder / "conftest.py")
    files += [f for m in ROOT_MODULES if (f := _module_file(m, [REPO])) is not None]
    return list(dict.fromkeys(files))


def _walk() -> Iterator[tuple[Path, list[tuple[str, bool]]]]:
    """(file, its imports as `_imports` gives them) for every repository file on the gpu-check path."""
    todo = root_files()
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        search = [path.parent, REPO] if "scripts" in path.relative_to(REPO).parts[:1] else [REPO]
        if path.name == "__init__.py" and "pkgutil.iter_modules(__path__)" in path.read_text():
            # a package that imports every module in it (the task, dataset and model registries): no import
            # statement names them, so they are taken as imported
            todo.extend(f for f in path.parent.glob("*.py") if f != path)
            todo.extend(f / "__init__.py" for f in path.parent.iterdir() if (f / "__init__.py").is_file())
        imports = _imports(path)
        for name, _ in imports:  # each repository module imported, and every package above it, runs
            parts = name.split(".")
            todo.extend(f for k in range(1, len(parts) + 1) if (f := _module_file(".".join(parts[:k]), search)))
        yield path, imports


def gpu_check_files() -> list[Path]:
    """Every repository file the gpu-check path runs or imports (at any depth), sorted."""
    return sorted(path for path, _ in _walk())


def third_party_imports() -> dict[str, set[str]]:
    """top-level third-party module -> the repository files that import it at import time."""
    stdlib = set(sys.stdlib_module_names)
    found: dict[str, set[str]] = {m.split(".")[0]: {"gpu_check.sh"} for m in ROOT_MODULES
                                  if _module_file(m, [REPO]) is None}
    for path, imports in _walk():
        search = [path.parent, REPO] if "scripts" in path.relative_to(REPO).parts[:1] else [REPO]
        for name, top in imports:
            parts = name.split(".")
            if any(_module_file(".".join(parts[:k]), search) for k in range(1, len(parts) + 1)):
                continue
            if top and parts[0] not in stdlib and not parts[0].startswith("_") and parts[0] != "__future__":
                found.setdefault(parts[0], set()).add(str(path.relative_to(REPO)))
    return found


def distribution_of(module: str, table: dict[str, list[str]] | None = None) -> str:
    """The installed distribution that provides top-level `module`; LookupError naming it if none does."""
    table = md.packages_distributions() if table is None else table
    dists = table.get(module)
    if not dists:
        raise LookupError(f"no installed distribution provides the module {module!r}: install the project's "
                          "requirements (make setup) in the environment that runs this")
    return normalize(dists[0])


def node_packages(path: Path = GPU_NODE_PACKAGES) -> set[str]:
    """The distributions the GPU node has: one name per line (`pip list --format=freeze` output works too)."""
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(normalize(re.split(r"[=<>!~ @]", line, maxsplit=1)[0]))
    return names


def _requirements(dist: str) -> list[str]:
    """The distributions `dist` (installed here) needs on the GPU node's Python."""
    # Here, not at the top: the preflight's --unimportable runs on a node's Python, which may lack packaging.
    from packaging.markers import Marker
    from packaging.requirements import Requirement

    out = []
    for text in md.requires(dist) or []:
        req = Requirement(text)
        if req.marker is None or Marker(str(req.marker)).evaluate(NODE_ENV):
            out.append(normalize(req.name))
    return out


def needed_distributions() -> dict[str, set[str]]:
    """distribution -> why (the modules, or the tool) the gpu-check path needs it for."""
    table = md.packages_distributions()
    needed: dict[str, set[str]] = {normalize(t): {"a program gpu_check.sh runs"} for t in TOOLS}
    for module in sorted(third_party_imports()):
        needed.setdefault(distribution_of(module, table), set()).add(f"import {module}")
    return needed


def split_by_node(needed: dict[str, set[str]], node: set[str]) -> tuple[dict[str, str], dict[str, str]]:
    """(to carry, on the node), each distribution -> installed version: the needed distributions not on the
    node and, followed through their requirements, what those need that the node lacks too."""
    carry: dict[str, str] = {}
    have: dict[str, str] = {}
    todo = sorted(needed)
    while todo:
        dist = todo.pop()
        if dist in carry or dist in have:
            continue
        version = md.version(dist)
        if dist in node:
            have[dist] = version
            continue
        carry[dist] = version
        todo.extend(_requirements(dist))
    return dict(sorted(carry.items())), dict(sorted(have.items()))


# Imported by gpu_check.sh only where present (the per-test timeout): not missing when absent.
OPTIONAL_MODULES = ("pytest_timeout",)


def unimportable() -> dict[str, set[str]]:
    """The modules of third_party_imports() that this interpreter cannot find, each with the files importing it."""
    return {module: files for module, files in sorted(third_party_imports().items())
            if module not in OPTIONAL_MODULES and importlib.util.find_spec(module) is None}


# PyTorch and the libraries of its CUDA build: a node-like environment installs its own (make test-compat).
TORCH_STACK = ("torch", "triton", "nvidia-", "cuda-")


def node_like(node: set[str]) -> dict[str, str]:
    """distribution -> version, for every one installed here that the node has too (PyTorch's stack left out):
    the node's share of this project's requirements. Run-time imports (tensorboard under training, say) are
    among them, which the import-time reading above cannot see."""
    out = {}
    for dist in md.distributions():
        name = normalize(dist.metadata["Name"])
        if name in node and not name.startswith(TORCH_STACK) and name not in ("pip", "setuptools", "wheel"):
            out[name] = dist.version
    return dict(sorted(out.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--node-packages", type=Path, default=GPU_NODE_PACKAGES,
                        help="what the GPU node has (default: %(default)s)")
    parser.add_argument("--node-like", action="store_true",
                        help="print name==version of every distribution installed here that the node has too, "
                             "PyTorch's own stack left out: what a node-like environment installs (make test-compat)")
    parser.add_argument("--unimportable", action="store_true",
                        help="print each module the gpu-check path imports that this Python cannot find, with the "
                             "files importing it; exit status 1 if any (needs the standard library only)")
    args = parser.parse_args(argv)
    if args.unimportable:
        absent = unimportable()
        for module, files in absent.items():
            print(f"{module} (imported by {', '.join(sorted(files)[:3])}{', ...' if len(files) > 3 else ''})")
        return 1 if absent else 0
    if args.node_like:
        for dist, version in node_like(node_packages(args.node_packages)).items():
            print(f"{dist}=={version}")
        return 0
    needed = needed_distributions()
    carry, _ = split_by_node(needed, node_packages(args.node_packages))
    for dist in sorted(needed):
        where = "carry" if dist in carry else "node"
        print(f"{where:<6} {dist}=={md.version(dist)}  ({', '.join(sorted(needed[dist]))})")
    for dist in sorted(set(carry) - set(needed)):
        print(f"carry  {dist}=={carry[dist]}  (required by a carried distribution)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
