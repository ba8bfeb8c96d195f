"""The guard of tests/conftest.py on deliberately leaking tests: each leak fails the test that left it, naming the
state and both values, and the tests after it run in the state they would have had alone.

The leaking tests run in a pytest of their own (a subprocess: this one's state stays untouched), with the
suite's guard fixtures.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CONFTEST = f"""
import sys
sys.path.insert(0, {str(REPO)!r})
from tests.conftest import (  # noqa: F401
    _module_state_guard, _process_state_guard, _session_state_guard, restores_process_state)
"""

LEAKS = """
import logging, os, signal
import numpy as np
import pytest
import torch
import torch.distributed as dist

THREADS = int(os.environ["THREADS_AT_START"])


def test_threads():
    torch.set_num_threads(1)


def test_threads_are_back_for_the_next_test():
    assert torch.get_num_threads() == THREADS


def test_environment():
    os.environ["SYNCTRAIN_LEAK"] = "1"


def test_working_directory(tmp_path):
    os.chdir(tmp_path)


def test_default_dtype():
    torch.set_default_dtype(torch.float64)


def test_torch_seed():
    torch.manual_seed(0)


def test_numpy_seed():
    np.random.seed(0)


def test_deterministic_algorithms():
    torch.use_deterministic_algorithms(True)


def test_backend_flags():
    torch.backends.cudnn.benchmark = not torch.backends.cudnn.benchmark


def test_frozen_backend_flags():
    torch.backends.disable_global_flags()


def test_logging():
    logging.getLogger().addHandler(logging.StreamHandler())


def test_signal_handler():
    signal.signal(signal.SIGUSR1, lambda *_: None)


def test_process_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def test_restored_with_monkeypatch_is_no_leak(monkeypatch):
    monkeypatch.setenv("SYNCTRAIN_LEAK", "1")
    monkeypatch.chdir("/")


def test_restored_with_the_fixture_is_no_leak(restores_process_state):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    logging.getLogger().addHandler(logging.StreamHandler())


def test_drawing_random_numbers_is_no_leak():
    torch.rand(3)


@pytest.fixture(scope="module")
def module_leak():
    torch.set_num_threads(1)


def test_uses_a_leaking_module_fixture(module_leak):
    pass
"""

EXPECTED = {  # leaking test -> what the guard must say
    "test_threads": "torch intra-op threads (torch.set_num_threads): {threads} -> 1",
    "test_environment": "environment variables: SYNCTRAIN_LEAK: '<unset>' -> '1'",
    "test_working_directory": "working directory: ",
    "test_default_dtype": "default dtype (torch.set_default_dtype): torch.float32 -> torch.float64",
    "test_torch_seed": "torch's global RNG seed (torch.manual_seed): seed ",
    "test_numpy_seed": "numpy's global RNG (np.random.seed or a draw from it): state changed",
    "test_deterministic_algorithms": "torch.use_deterministic_algorithms (enabled, warn_only): (False, False) -> (True,",
    "test_backend_flags": "torch backend flags: cudnn.benchmark: ",
    "test_frozen_backend_flags": "torch.backends flags frozen (torch.backends.disable_global_flags): False -> True",
    "test_logging": "logging configuration: : ",
    "test_signal_handler": "signal handlers: SIGUSR1: <Handlers.SIG_DFL: 0> -> <function",
    "test_process_group": "default process group (torch.distributed): None -> 'gloo world of 1'",
}


def test_each_leak_fails_its_test_naming_what_changed(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_leaks.py").write_text(LEAKS)
    threads = 2
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "THREADS_AT_START": str(threads)}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                          "-o", "addopts=", "test_leaks.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    out = run.stdout + run.stderr
    assert run.returncode != 0, out[-5000:]
    for test, message in EXPECTED.items():
        said = f"test_leaks.py::{test} left process-wide state changed"
        assert said in out, f"{test}: the guard did not fail it\n{out[-5000:]}"
        block = out[out.index(said):][:2000]
        assert message.format(threads=threads) in block, f"{test}: expected {message!r} in\n{block}"
    assert "test_leaks.py (its module-scoped fixtures) left process-wide state changed" in out, out[-5000:]
    # What restores itself passes, and a leak is undone before the next test runs.
    for clean in ("test_threads_are_back_for_the_next_test", "test_restored_with_monkeypatch_is_no_leak",
                  "test_restored_with_the_fixture_is_no_leak", "test_drawing_random_numbers_is_no_leak"):
        assert f"test_leaks.py::{clean} left" not in out and f"FAILED test_leaks.py::{clean}" not in out, out[-5000:]
    assert f"{len(EXPECTED)} passed" not in out
    summary = out.strip().splitlines()[-1]
    assert f"{len(EXPECTED) + 1} errors" in summary, summary  # every leak, and the module fixture's
