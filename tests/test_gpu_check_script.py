"""`make gpu-check` (scripts/gpu_check.sh) off a GPU: it must stop at once with a clear message and exit 2,
having checked nothing. (shellcheck and `bash -n` of the script: tests/cluster/test_launch_scripts.py.)"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: make gpu-check would run for real")
def test_stops_clearly_without_a_gpu(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), str(tmp_path / "out")], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "STOP: no CUDA GPU visible" in proc.stdout and "torch.cuda.is_available() is False" in proc.stdout
    assert "nothing was checked" in proc.stdout
    assert "STOP: no CUDA GPU visible" in (tmp_path / "out" / "summary.txt").read_text()
    assert not (tmp_path / "out" / "report.json").exists()


def test_make_target_runs_the_script_with_the_out_dir():
    # --no-print-directory: under `make test` the sub-make would otherwise announce its directory.
    proc = subprocess.run(["make", "--no-print-directory", "-n", "gpu-check", "OUT=/tmp/somewhere"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "bash scripts/gpu_check.sh /tmp/somewhere"
