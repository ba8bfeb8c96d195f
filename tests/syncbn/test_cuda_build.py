"""The CUDA kernels compile (and link against the contract) on machines without a GPU.

CI has nvcc but no GPU: this builds the CUDA variant ahead of time as the Docker image does
(`python -m src.syncbn.build --cuda`, one arch, sm_90, so it stays quick), then imports the library in a
fresh interpreter. The import resolves every symbol (dlopen RTLD_NOW),
so a kernel whose signature drifted from csrc/ops.h fails here, not on the first GPU run. The build
finds the toolkit itself (src/syncbn/toolkit.py: CUDA_HOME, else nvcc on PATH, else /usr/local/cuda*),
and must compile with that toolkit's nvcc and headers even where nvcc on PATH is a wrapper script.
Skipped where no toolkit is found; marked slow (a few minutes on 2 cores when it compiles).

The build is kept between runs in its own cache folder (one per toolkit) under the extensions
directory: the build's name hashes the sources, headers, flags, arch list and tool versions, so any
edit that could change the outcome compiles again, while an unchanged tree reuses the library and only
the checks on it (the toolkit in build.ninja, the import) run again. `make clean` forces a fresh compile.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from src.syncbn.fake_kernels import OP_NAMES
from src.syncbn import toolkit
from src.syncbn.extension import extensions_dir

REPO = Path(__file__).resolve().parents[2]
TOOLKIT = toolkit.find_cuda_toolkit().toolkit

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(TOOLKIT is None, reason="no CUDA toolkit found (set CUDA_HOME); nothing to compile with"),
]

OPS = OP_NAMES

# Builds the CUDA variant in a child process with the very call `python -m src.syncbn.build --cuda` makes
# for it (extension.build on make_spec(with_cuda=True), not imported: no GPU here). The CLI would also
# build the CPU variant first, which the CPU tests already compile: skipping it halves this test's time.
BUILD = """
from src.syncbn import extension
spec = extension.make_spec(with_cuda=True)
extension.build(spec, import_module=False)
print("LIBRARY", spec.library)
print("COMPILED", extension.last_build_info().get("compiled"))
"""

IMPORT = """
import importlib.util, sys
import torch  # loads libc10_cuda / libtorch_cuda, which the extension links against
path = sys.argv[1]
spec = importlib.util.spec_from_file_location(path.rsplit("/", 1)[-1].split(".")[0], path)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
missing = [op for op in {ops!r} if not hasattr(mod, op)]
assert not missing, missing
print("IMPORTED", mod.__name__)
"""


def build_cache() -> Path:
    """The folder this test builds into, one per toolkit: the build's own hash does not cover which nvcc
    compiled it, and build.ninja must name the toolkit found now."""
    key = hashlib.sha256(f"{TOOLKIT.root}|{TOOLKIT.nvcc}|{TOOLKIT.version}".encode()).hexdigest()[:12]
    return extensions_dir() / f"cuda-compile-check-{key}"


@pytest.mark.timeout(1800)
def test_cuda_sources_compile_and_link() -> None:
    # TORCH_CUDA_ARCH_LIST=9.0: SASS for one arch only (cpp_extension adds no PTX without "+PTX"); the
    # test asserts nothing about archs, and each further arch would add a device pass per .cu file.
    env = dict(os.environ, TORCH_CUDA_ARCH_LIST="9.0", SYNCTRAIN_EXTENSIONS_DIR=str(build_cache()),
               PYTHONPATH=str(REPO))
    env.setdefault("MAX_JOBS", str(min(os.cpu_count() or 1, 4)))
    start = time.monotonic()
    built = subprocess.run([sys.executable, "-c", BUILD], cwd=REPO, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - start
    assert built.returncode == 0, f"CUDA build failed after {seconds:.0f} s:\n{built.stdout[-4000:]}\n{built.stderr[-8000:]}"
    library = [line.split(" ", 1)[1] for line in built.stdout.splitlines() if line.startswith("LIBRARY ")][-1]
    assert Path(library).exists(), f"the build reported success but {library} does not exist"
    ninja = (Path(library).parent / "build.ninja").read_text()
    assert f"nvcc = {TOOLKIT.nvcc}" in ninja and f"-isystem {TOOLKIT.root}/include" in ninja, (
        "the CUDA variant was not compiled with the toolkit src/syncbn/toolkit.py found")
    compiled = [line.split(" ", 1)[1] for line in built.stdout.splitlines() if line.startswith("COMPILED ")][-1]
    print(f"CUDA variant {'compiled' if compiled == 'True' else 'already built (unchanged sources)'} in "
          f"{seconds:.0f} s (TORCH_CUDA_ARCH_LIST=9.0, MAX_JOBS={env['MAX_JOBS']})")
    imported = subprocess.run([sys.executable, "-c", IMPORT.format(ops=OPS), library], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=300)
    assert imported.returncode == 0, (
        "the CUDA variant compiled but does not import (an undefined symbol usually means a kernel's "
        f"signature in csrc/cuda/ drifted from csrc/syncbn.h):\n{imported.stderr[-4000:]}")
