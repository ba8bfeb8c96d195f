"""GPU machines without a usable nvcc: the CPU variant is built, and norm=syncbn on CUDA is refused at start-up.

The scenarios run in a fresh interpreter that pretends to have a GPU (torch.cuda.is_available() -> True)
and controls what it can see of the CUDA toolkit: CUDA_HOME, PATH, and (to hide the conventional
/usr/local/cuda* installs of this machine) toolkit.conventional_roots. The extension cache is a fresh
directory, so no prebuilt CUDA variant can stand in for the toolkit.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from src.syncbn import toolkit

REPO = Path(__file__).resolve().parents[2]

# Runs each scenario (CUDA_HOME, PATH, whether the conventional installs are hidden) in turn, in one
# fresh interpreter (importing torch and the configs costs seconds); prints one JSON result per scenario.
PROBE = """
import json, os, sys, torch
from pathlib import Path
torch.cuda.is_available = lambda: True  # a GPU machine
from src.syncbn import extension, toolkit
from src.models.config import NormConfig
real_roots = toolkit.conventional_roots
for scenario in json.loads(sys.argv[1]):
    os.environ.pop("CUDA_HOME", None)
    if scenario["cuda_home"] is not None:
        os.environ["CUDA_HOME"] = scenario["cuda_home"]
    os.environ["PATH"] = scenario["path"]
    toolkit.conventional_roots = (lambda: [Path("/nonexistent/cuda")]) if scenario["hide"] else real_roots
    toolkit._search.cache_clear()  # its key is the environment, not the patched roots
    out = {"variant": extension.make_spec().name, "problem": extension.cuda_kernels_problem()}
    found = toolkit.find_cuda_toolkit().toolkit
    out["root"] = str(found.root) if found else None
    try:
        NormConfig(name="syncbn").validate("auto")
        out["validate"] = None
    except ValueError as exc:
        out["validate"] = str(exc)
    try:
        extension.check_build_tools(extension.make_spec(with_cuda=True))
        out["build"] = None
    except extension.ExtensionBuildError as exc:
        out["build"] = str(exc)
    print("RESULT", json.dumps(out))
"""


def bare_path(d: Path, *tools: tuple[str, str]) -> str:
    """A PATH with only the given (name, script) tools in it, plus the system's basic utilities."""
    d.mkdir(parents=True, exist_ok=True)
    for name, script in tools:
        (d / name).write_text(script)
        (d / name).chmod(0o755)
    return f"{d}:/usr/bin:/bin"


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    """Every scenario's outcome, from one subprocess."""
    tmp = tmp_path_factory.mktemp("toolkit")
    fake = tmp / "cuda-11.8"  # a toolkit whose nvcc reports a CUDA major torch was not built with
    (fake / "bin").mkdir(parents=True)
    (fake / "include").mkdir()
    (fake / "include" / "cuda_runtime.h").write_text("")
    (fake / "bin" / "nvcc").write_text("#!/bin/sh\necho 'Cuda compilation tools, release 11.8, V11.8.89'\n")
    (fake / "bin" / "nvcc").chmod(0o755)
    found = toolkit.find_cuda_toolkit().toolkit
    wrapper = bare_path(tmp / "wrapper" / "bin", ("nvcc", f"#!/bin/sh\nexec {found.nvcc} \"$@\"\n")) if found else None
    empty = bare_path(tmp / "empty")
    scenarios = {
        "no_nvcc_anywhere": (None, empty, True),
        "cuda_home_without_nvcc": (str(tmp / "no_toolkit"), empty, False),
        "other_cuda_major": (str(fake), empty, True),
    }
    if found:
        scenarios["wrapper_only"] = (None, wrapper, True)
        scenarios["wrapper_and_conventional"] = (None, wrapper, False)
        scenarios["usable_cuda_home"] = (str(found.root), empty, True)
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    env.update(PYTHONPATH=str(REPO), TORCH_CUDA_ARCH_LIST="9.0", OMP_NUM_THREADS="1",
               SYNCTRAIN_EXTENSIONS_DIR=str(tmp / "cache"))
    arg = json.dumps([{"cuda_home": h, "path": p, "hide": hide} for h, p, hide in scenarios.values()])
    out = subprocess.run([sys.executable, "-c", PROBE, arg], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line[7:]) for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    return {"tmp": tmp, **dict(zip(scenarios, lines))}


def assert_refused(result: dict, why: str) -> None:
    want = torch.version.cuda
    assert result["variant"].startswith("syncbn_cpu_"), result  # CPU tensors keep working
    for text in (result["problem"], result["validate"], result["build"]):
        assert text and why in text, (why, text)
        assert f"CUDA toolkit {want}" in text and "CUDA_HOME" in text and "norm=torch_syncbn" in text, text
    assert result["validate"].startswith("norm=syncbn on CUDA (device=auto): ")


def test_no_nvcc_anywhere(results):
    assert_refused(results["no_nvcc_anywhere"], "CUDA_HOME unset, no nvcc on PATH, none in /nonexistent/cuda")


def test_cuda_home_without_nvcc(results):
    assert_refused(results["cuda_home_without_nvcc"], f"CUDA_HOME={results['tmp'] / 'no_toolkit'}: no bin/nvcc")


def test_nvcc_of_another_cuda_major(results):
    assert_refused(results["other_cuda_major"], f"CUDA 11.8, but this torch was built with CUDA {torch.version.cuda}")


def test_wrapper_script_nvcc_is_not_taken_for_a_toolkit_root(results):
    """nvcc on PATH may be a script that execs the real one: its folder's parent has no headers."""
    if "wrapper_only" not in results:
        pytest.skip("no CUDA toolkit on this machine")
    assert_refused(results["wrapper_only"],
                   f"{results['tmp'] / 'wrapper'}: bin/nvcc but no include/cuda_runtime.h (not a toolkit root)")
    # With the conventional installs visible, the real toolkit is found instead of PyTorch's guess.
    result = results["wrapper_and_conventional"]
    assert result["root"] and Path(result["root"], "include", "cuda_runtime.h").exists(), result
    assert result["problem"] is None and result["validate"] is None and result["build"] is None
    assert result["variant"].startswith("syncbn_cuda_")


def test_usable_toolkit_selects_the_cuda_variant(results):
    if "usable_cuda_home" not in results:
        pytest.skip("no CUDA toolkit on this machine")
    result = results["usable_cuda_home"]
    assert result["variant"].startswith("syncbn_cuda_") and result["problem"] is None
    assert result["validate"] is None and result["build"] is None and result["root"]


def test_no_gpu_needs_no_toolkit():
    """On a machine without GPUs, norm=syncbn never asks for nvcc."""
    from src.models.config import NormConfig
    from src.syncbn.extension import cuda_kernels_problem

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert cuda_kernels_problem() is None
    NormConfig(name="syncbn").validate("auto")
