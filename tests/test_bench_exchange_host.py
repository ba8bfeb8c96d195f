"""scripts/bench_exchange_host.py runs as `make gpu-check` calls it, here on the CPU with a small model: every design
times, none reads the host in a step, and the JSON holds what the table shows."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def test_the_script_on_a_small_cpu_model(tmp_path: Path) -> None:
    out = tmp_path / "exchange.json"
    cmd = [sys.executable, "scripts/bench_exchange_host.py", "--device", "cpu", "--world-size", "8", "--model",
           "resnet18", "--dtype", "bfloat16", "--channels-last", "--batch", "2", "--image-size", "32", "--rounds", "2",
           "--steps", "1", "--json", str(out)]
    run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "| design | step ms |" in run.stdout and "| two_reduces |" in run.stdout
    result = json.loads(out.read_text())
    assert result["config"]["world_size"] == 8 and result["config"]["channels_last"]
    for design in ("bn", "gather", "two_reduces"):
        r = result["results"][design]
        assert r["step_ms"] > 0 and r["host_ms"] > 0 and len(r["step_ms_per_round"]) == 2
        assert r["host_reads_per_step"] == 0, (design, r)
    assert result["results"]["bn"]["step_vs_bn"] == 1.0


def test_the_read_counter_sees_a_read() -> None:
    from scripts import bench_exchange_host as bench

    t = torch.ones(3)
    assert bench.count_host_reads(lambda: t.sum().item()) == 1
    assert bench.count_host_reads(lambda: bool(t.all()) and float(t[0])) == 2
    assert bench.count_host_reads(lambda: t * 2) == 0
