"""What `make gpu-check` needs on a GPU node without network (scripts/gpu_imports.py, scripts/gpu_bundle.py): the
bundle's list covers every third-party import of the gpu-check path.

The list is read off the source; the check here runs the path instead: a fresh interpreter imports every
file gpu_check.sh runs (scripts, test files and their conftest.py, train.py) and trains one step as the
training compare does (on the CPU), then every module it loaded is traced to the installed distribution
that owns its file. Each must be on the node (scripts/gpu_node_packages.txt) or carried. Also: every script
and module gpu_check.sh names is a root of the reading, and the size report adds up."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import gpu_bundle, gpu_imports

REPO = Path(__file__).resolve().parents[1]
# Hydra imports every plugin installed in its hydra_plugins namespace at start-up (here the submitit launcher
# of requirements.txt); where a plugin is not installed nothing imports it, so it is not the path's.
OPTIONAL = {"hydra-submitit-launcher"}

# Runs in a fresh interpreter: imports the path's files, trains one step, prints the distributions that own
# the loaded modules' files as JSON.
TRACE = r"""
import importlib, importlib.metadata as md, json, runpy, sys, sysconfig
from pathlib import Path
repo, run_dir, modules = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
sys.path[:0] = [str(repo), str(repo / "scripts")]  # the scripts import their neighbours as gpu_check.sh runs them
for name in modules:
    importlib.import_module(name)
sys.argv = ["train.py", "norm=syncbn", "model=resnet20", "data=shapes", "data.train_size=32", "data.val_size=16",
            "data.batch_size=16", "device=cpu", "trainer.dtype=float64", "trainer.deterministic=true",
            "trainer.max_steps=1", "trainer.log_every=1", "seed=0", f"hydra.run.dir={run_dir}"]
try:
    runpy.run_path(str(repo / "train.py"), run_name="__main__")
except SystemExit as exit:
    assert not exit.code, exit.code
owner = {}
for dist in md.distributions():
    for f in dist.files or []:
        owner[str(Path(dist.locate_file(f)).resolve())] = dist.metadata["Name"]
stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
used, unknown = {}, []
for name, module in list(sys.modules.items()):
    path = getattr(module, "__file__", None)
    if not path or not Path(path).is_absolute():  # builtins, namespaces; torch.ops' "_ops.py" names no file
        continue
    path = Path(path).resolve()
    dist = owner.get(str(path))
    # The repository's own modules and the standard library; an environment or a bundle inside the checkout
    # (make test-compat's .venv-compat) holds distributions' files.
    if dist is None and (repo in path.parents or stdlib in path.parents and "site-packages" not in path.parts):
        continue
    if dist is None:
        unknown.append(name)
    else:
        used.setdefault(dist, name)
print(json.dumps({"used": used, "unknown": unknown}))
"""


def test_gpu_check_sh_runs_only_what_the_reading_starts_from():
    text = (REPO / "scripts" / "gpu_check.sh").read_text()
    scripts = set(re.findall(r"\bscripts/\w+\.py\b", text)) - {"scripts/gpu_check_probe.py", "scripts/gpu_check_report.py"}
    modules = set(re.findall(r'"?\$PY"? -m (\w[\w.]*)', text)) | set(re.findall(r"from (src[\w.]*) import", text))
    assert scripts and modules
    assert scripts <= set(gpu_imports.ROOT_FILES), scripts - set(gpu_imports.ROOT_FILES)
    assert modules <= set(gpu_imports.ROOT_MODULES) | {"src.syncbn"}, modules - set(gpu_imports.ROOT_MODULES)
    steps = gpu_imports.gpu_check_test_files()
    assert set(steps) == {"kernel_tests", "slow_tests"} and all((REPO / f).is_file() for fs in steps.values() for f in fs)


def test_the_bundle_carries_what_the_node_lacks():
    carry, have = gpu_imports.split_by_node(gpu_imports.needed_distributions(), gpu_imports.node_packages())
    assert {"hydra-core", "omegaconf", "antlr4-python3-runtime"} <= set(carry), carry
    assert {"torch", "torchvision", "numpy", "pytest"} <= set(have) and not set(carry) & set(have)


@pytest.mark.slow
def test_the_bundle_covers_every_import_of_the_gpu_check_path(tmp_path):
    """Every distribution whose module the path loads (one training step included) is on the node or carried."""
    modules = []
    for path in gpu_imports.root_files():
        rel = path.relative_to(REPO).with_suffix("")
        if rel.parts[0] == "scripts":
            modules.append(rel.name)  # a script, importable from its folder
        elif rel.name != "train":  # train.py runs below
            modules.append(".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts))
    proc = subprocess.run([sys.executable, "-c", TRACE, str(REPO), str(tmp_path / "run"), *modules], cwd=tmp_path,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    trace = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not trace["unknown"], f"modules no installed distribution owns: {trace['unknown']}"
    node = gpu_imports.node_packages()
    carry, _ = gpu_imports.split_by_node(gpu_imports.needed_distributions(), node)
    used = {gpu_imports.normalize(dist): module for dist, module in trace["used"].items()}
    missing = {dist: module for dist, module in used.items() if dist not in node and dist not in carry}
    assert set(missing) <= OPTIONAL, f"loaded on the gpu-check path, neither on the node nor carried: {missing}"
    assert {"hydra-core", "omegaconf", "torch"} <= set(used)  # the trace saw the training step


def test_the_size_report_adds_the_repository(tmp_path):
    wheels = {}
    for name, size in (("a-1-py3-none-any.whl", 3 * 1024 * 1024), ("b-2-py3-none-any.whl", 1024 * 1024)):
        (tmp_path / name).write_bytes(b"\0" * size)
        wheels[name] = tmp_path / name
    table, fits = gpu_bundle.report(wheels, 58 * 1024 * 1024, 64.0)
    assert fits and "| wheels together | 4.00 |" in table and "**62.00**" in table
    table, fits = gpu_bundle.report(wheels, 61 * 1024 * 1024, 64.0)
    assert not fits and "OVER THE LIMIT" in table
