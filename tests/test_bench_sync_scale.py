"""scripts/bench_sync_scale.py: the layer shapes it takes from torchvision, its byte and NCCL models, and its
measurement on real gloo ranks (in the shared pool; the script's own torchrun launch is the slow test)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import bench_sync_scale as bench
from tests.support.gloo import run_on_ranks

REPO = Path(__file__).resolve().parents[1]


def test_layer_shapes_are_every_batchnorm_of_the_torchvision_models_in_forward_order() -> None:
    resnet = bench.layer_channels("resnet50")
    assert len(resnet) == 53 and sum(resnet) == 26_560
    assert resnet[:5] == [64, 64, 64, 256, 256]  # stem, then the first bottleneck: bn1-3, then its downsample
    deeplab = bench.layer_channels("deeplabv3_resnet50")
    assert len(deeplab) == 60 and deeplab[:53] == resnet  # the backbone, then ASPP (5 + projection) and the head
    assert deeplab[53:] == [256] * 7


def test_byte_model_gather_grows_linearly_the_all_reduces_stay_below_twice_the_payload() -> None:
    channels = [64, 256, 2048]
    payload = sum((2 * c + 1) * 8 for c in channels)
    backward = sum(bench.ring_bytes("all_reduce", 2 * c * 4, 1024) for c in channels)
    gathers = [bench.modelled_step_bytes(channels, "gather", w) for w in (2, 4, 8, 16)]
    assert gathers[0] == pytest.approx(payload + sum(2 * c * 4 for c in channels))  # W = 2: both rings send 1x
    for w in (8, 64, 1024):  # each extra rank adds one more rank's statistics to what every rank sends
        extra = bench.modelled_step_bytes(channels, "gather", w + 1) - bench.modelled_step_bytes(channels, "gather", w)
        assert extra == pytest.approx(payload + sum(
            bench.ring_bytes("all_reduce", 2 * c * 4, w + 1) - bench.ring_bytes("all_reduce", 2 * c * 4, w)
            for c in channels))
    for w in (2, 8, 1024):
        for design in ("shifted", "two_reduces"):  # 2C+1 values per layer: in one all_reduce, or in C+1 and C
            forward = bench.modelled_step_bytes(channels, design, w) - sum(
                bench.ring_bytes("all_reduce", 2 * c * 4, w) for c in channels)
            assert payload <= forward < 2 * payload
            assert forward == pytest.approx(bench.ring_bytes("all_reduce", payload, w))
    assert bench.modelled_step_bytes(channels, "gather", 1024) > 300 * (payload + backward)


def test_nccl_model_latency_ring_linear_tree_logarithmic_and_the_choice() -> None:
    tiny = 8.0  # bytes: latency only
    ring = [bench.nccl_candidates("all_reduce", tiny, w)[("ring", "LL")] for w in (16, 32, 64, 128)]
    tree = [bench.nccl_candidates("all_reduce", tiny, w)[("tree", "LL")] for w in (16, 32, 64, 128)]
    tree_steps = [b - a for a, b in zip(tree, tree[1:])]  # one more tree level per doubling of the nodes
    assert max(tree_steps) - min(tree_steps) < 1e-6 * tree[-1] and tree_steps[0] > 0
    ring_steps = [b - a for a, b in zip(ring, ring[1:])]
    assert ring_steps[1] == pytest.approx(2 * ring_steps[0], rel=0.01)  # linear in W: doubling W doubles the step
    assert bench.nccl_time_us("all_reduce", tiny, 1024)[1] == "tree/LL"
    assert bench.nccl_candidates("all_gather", tiny, 16).keys() == {("ring", "LL"), ("ring", "Simple")}
    big = 1e9  # bytes: bandwidth-bound, Simple beats LL
    assert bench.nccl_time_us("all_reduce", big, 8)[1].endswith("/Simple")
    resnet = [64] * 10 + [2048] * 10
    small, large = bench.project(resnet, 8), bench.project(resnet, 1024)
    assert large["gather"]["step_us"] > 5 * large["two_reduces"]["step_us"]
    for design in ("gather", "shifted"):  # the same backward in all three
        assert large[design]["backward_us"] == large["two_reduces"]["backward_us"]
    # Latency-bound at these sizes: two collectives in a row cost more than one of the same total size.
    assert large["shifted"]["forward_us"] < large["two_reduces"]["forward_us"] < 2 * large["shifted"]["forward_us"]
    assert small["gather"]["step_us"] < large["gather"]["step_us"]


def test_measurement_on_two_gloo_ranks_counts_collectives_and_bytes() -> None:
    channels = [4, 32]
    results = run_on_ranks(2, bench.measure, {"tiny": channels}, 2, 1)
    r = results[0]["tiny"]
    assert r["gather"]["calls_per_step"] == {"all_gather": 2, "all_reduce": 2}
    assert r["shifted"]["calls_per_step"] == {"all_gather": 0, "all_reduce": 4}
    assert r["two_reduces"]["calls_per_step"] == {"all_gather": 0, "all_reduce": 6}
    for design in bench.DESIGNS:
        d = r[design]
        model = bench.modelled_step_bytes(channels, design, 2)
        # gloo's writes: the payload plus at most a few hundred bytes of its own per collective
        assert model <= d["sent_bytes_io"] < model + 4 * 1024, (design, d["sent_bytes_io"], model)
        assert d["step_s"] > 0 and d["forward_collective_s"] > 0
        assert results[1]["tiny"][design]["step_s"] == d["step_s"]  # the slowest rank's time, on every rank


@pytest.mark.slow
def test_the_script_quick_run(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    run = subprocess.run([sys.executable, "scripts/bench_sync_scale.py", "--quick", "--out", str(out)], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "| resnet50 | 2 | gather | 53 + 53 |" in run.stdout and "| resnet50 | 1024 (128) |" in run.stdout
    result = json.loads(out.read_text())
    assert result["models"]["resnet50"]["sum_c"] == 26_560
    measured = result["measured"]["2"]["resnet50"]
    for design in bench.DESIGNS:
        assert measured[design]["sent_bytes_io"] >= measured[design]["model_bytes"] > 0
