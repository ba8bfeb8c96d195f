"""Find the CUDA toolkit (nvcc) that can build the CUDA variant of the SyncBN kernels, or say why none can.

torch from pip ships the CUDA runtime but no nvcc, so a machine can have GPUs and no way to compile our
CUDA kernels. The rules, in order:
- `CUDA_HOME` (or `CUDA_PATH`) set: that root only; it is the user's explicit choice.
- else the root of `nvcc` on PATH, symlinks resolved. PyTorch's own guess takes the grandparent of the
  first `nvcc` it finds, which for a wrapper script (/usr/local/bin/nvcc that execs the real one) is
  /usr/local, without headers; so a root counts only if it has include/cuda_runtime.h, and the
  conventional /usr/local/cuda-<torch.version.cuda> and /usr/local/cuda are tried next.
- the toolkit must report (`nvcc --version`) the CUDA major version torch was built with
  (`torch.version.cuda`), the rule PyTorch's extension builder enforces itself.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch


def environment_tool(name: str) -> str | None:
    """Path of the command `name` that this Python environment installed (its scripts folder), else PATH's.

    `pip install` puts console tools (ninja, shellcheck, hadolint, ...) in the environment's bin folder, which is
    on PATH only when the environment is activated; `.venv/bin/torchrun train.py` and `.venv/bin/python -m pytest`
    run without activating it, so PATH alone would miss what requirements.txt installed.
    """
    for folder in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        candidate = os.path.join(folder, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which(name)


@dataclass(frozen=True)
class CudaToolkit:
    """A usable CUDA toolkit: its root (CUDA_HOME), nvcc and the version nvcc reports."""

    root: Path
    nvcc: Path
    version: str  # "13.0"


@dataclass(frozen=True)
class ToolkitSearch:
    """The result of looking for a toolkit: the one found, else what was tried and why it failed."""

    toolkit: CudaToolkit | None
    tried: tuple[str, ...]  # one line per rejected candidate, or that there was none


def conventional_roots() -> list[Path]:
    """Where CUDA toolkits install by default, matching version first."""
    return ([Path(f"/usr/local/cuda-{torch.version.cuda}")] if torch.version.cuda else []) + [Path("/usr/local/cuda")]


def _candidates() -> tuple[list[Path], str | None]:
    """Roots to try in order, and the environment variable that chose them (None: searched)."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        value = os.environ.get(var)
        if value:
            return [Path(value).expanduser()], var
    roots: list[Path] = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(Path(nvcc).resolve().parents[1])
    roots += [r for r in conventional_roots() if r.exists()]
    return list(dict.fromkeys(roots)), None


def _nvcc_version(nvcc: Path) -> str | None:
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"release (\d+\.\d+)", out)
    return match.group(1) if match else None


def _check_root(root: Path) -> CudaToolkit | str:
    """The toolkit at `root`, or why it is not usable."""
    nvcc = root / "bin" / "nvcc"
    if not nvcc.exists():
        return f"{root}: no bin/nvcc"
    if not (root / "include" / "cuda_runtime.h").exists():
        return f"{root}: bin/nvcc but no include/cuda_runtime.h (not a toolkit root)"
    version = _nvcc_version(nvcc)
    if version is None:
        return f"{nvcc}: `nvcc --version` failed or printed no release number"
    wanted = torch.version.cuda
    if wanted and version.split(".")[0] != wanted.split(".")[0]:
        return f"{nvcc}: CUDA {version}, but this torch was built with CUDA {wanted}"
    return CudaToolkit(root=root, nvcc=nvcc, version=version)


@functools.lru_cache(maxsize=None)
def _search(env_key: tuple[str | None, ...]) -> ToolkitSearch:
    roots, chosen_by = _candidates()
    tried = []
    for root in roots:
        result = _check_root(root)
        if isinstance(result, CudaToolkit):
            return ToolkitSearch(result, tuple(tried))
        tried.append(f"{chosen_by}={root}: {result.split(': ', 1)[1]}" if chosen_by else result)
    if chosen_by is None and not shutil.which("nvcc"):
        tried.insert(0, "CUDA_HOME unset, no nvcc on PATH" + ("" if roots else ", none in " + ", ".join(
            str(r) for r in conventional_roots())))
    return ToolkitSearch(None, tuple(tried))


def find_cuda_toolkit() -> ToolkitSearch:
    """Look for a usable toolkit (cached per CUDA_HOME / CUDA_PATH / PATH)."""
    return _search((os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), os.environ.get("PATH")))


def install_advice() -> str:
    """The two ways out when the CUDA kernels cannot be built: install the toolkit, or norm=torch_syncbn."""
    want = torch.version.cuda or "matching torch.version.cuda"
    return (f"Either install the CUDA toolkit {want} (its nvcc; `python -c 'import torch; "
            f"print(torch.version.cuda)'` says which) and point CUDA_HOME at its root, e.g. "
            f"`export CUDA_HOME=/usr/local/cuda-{want}`; or use PyTorch's own synchronised BatchNorm "
            "with `norm=torch_syncbn` (CUDA + NCCL), which needs no compiler.")


def missing_toolkit_message(search: ToolkitSearch) -> str:
    """Why the CUDA kernels cannot be built here, and what to do about it."""
    return ("the CUDA variant of the SyncBN kernels needs nvcc from a CUDA toolkit matching "
            f"torch.version.cuda={torch.version.cuda}, and none was found ({'; '.join(search.tried)}). "
            + install_advice())
