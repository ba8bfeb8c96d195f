"""The SyncBN CUDA self-check (src/syncbn/selfcheck.py): the same run_selfcheck a GPU user gets, here on the
emulated build (it must pass) and on the deliberately faulty emulated variant (it must name the wrong op);
and the gate around it (norm.cuda_selfcheck modes, the on-disk memory, the fallback to nn.SyncBatchNorm),
with the check itself stubbed so no GPU is needed."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from src.models.config import NormConfig
from src.models.norms import checked_cuda_syncbn, finalize_norms
from src.syncbn import selfcheck
from src.syncbn import selfcheck_cases as sc
# part: gpu-tools
from tests.syncbn.cuda_cases import one_intraop_thread
# /part

REPO = Path(__file__).resolve().parents[2]


# part: gpu-tools
@pytest.mark.cuda_emulated
def test_selfcheck_passes_on_the_emulated_build(caplog):
    """Every op, case and dtype agrees with the float64 reference on the emulated kernels."""
    from src.syncbn.extension import load_emulated_cuda_extension

    with one_intraop_thread():
        report = selfcheck.run_selfcheck(load_emulated_cuda_extension("h100"), "cpu", device_name="emulated h100")
    # per case x dtype: stats, mean sums and deviation sums per rank, 5 gather outputs, 5 reduced_stats outputs,
    # elemt + backward_reduce + backward_elemt per rank
    per_dtype = sum(6 * len(c.ranks) + 10 for c in sc.CASES)
    assert report.comparisons == per_dtype * len(sc.DTYPES)
    line = report.summary()
    for part in ("8 ops x 4 cases", "float32, float16, bfloat16, float64", "2x4x128x128-contiguous-ranks1+1",
                 "against float64"):
        assert part in line, line


@pytest.mark.cuda_emulated
def test_selfcheck_catches_the_faulty_variant(tmp_path):
    """The variant built with SYNCTRAIN_SELFCHECK_FAULT (channel 0's sum(dy * xhat) doubled) fails, and the
    error names the op, the case, the difference and the way out. In a subprocess: two emulated builds
    in one process would share the emulator's process-wide state."""
    code = textwrap.dedent("""
        from src.syncbn.extension import load_emulated_cuda_extension
        from src.syncbn.selfcheck import SelfCheckError, run_selfcheck
        try:
            run_selfcheck(load_emulated_cuda_extension("h100", fault=True), "cpu", device_name="faulty emulated")
        except SelfCheckError as err:
            print("CAUGHT", err)
        else:
            print("MISSED")
    """)
    # One intra-op thread, as in the test above (tests/syncbn/cuda_cases.py: one_intraop_thread says why).
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=1500)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "CAUGHT" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
    msg = out.stdout
    for part in ("op batch_norm_backward_reduce", "case 5x8x4x6-contiguous-ranks3+2 float32",
                 "[sum_dy, sum_dy_xhat]", "max abs difference", "norm=torch_syncbn", "norm.cuda_selfcheck=fallback"):
        assert part in msg, (part, msg)
# /part


def test_compare_rejects_nan_and_wrong_values():
    exp = torch.tensor([1.0, -2.0, 3.0])
    assert sc.compare(exp + 1e-7, exp, 1e-5) is None
    assert sc.compare(torch.tensor([1.0, float("nan"), 3.0]), exp, 1e-5)[2] == 1
    diff, allowed, index = sc.compare(torch.tensor([1.0, -2.0, 3.1]), exp, 1e-5)
    assert index == 2 and diff == pytest.approx(0.1, rel=1e-6) and allowed < 1e-4
    assert sc.compare(torch.ones(2), torch.ones(3), 1e-5) == (float("inf"), 0.0, -1)


# --- The gate, with the check stubbed ------------------------------------------------------------------

@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    """A pretend GPU: device_key is fixed, the cache lives in tmp_path, run_selfcheck is counted."""
    monkeypatch.setenv("SYNCTRAIN_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(selfcheck, "device_key", lambda device, build: f"Fake GPU | sm_90 | {build}")
    state = SimpleNamespace(calls=0, fail=False)

    def fake_run(ops, device, *, device_name=None, **_):
        state.calls += 1
        if state.fail:
            raise selfcheck.SelfCheckError(f"SyncBN CUDA self-check failed on {device_name}: op batch_norm_elemt")
        return selfcheck.SelfCheckReport(device=device_name, cases=["c"], dtypes=["float32"],
                                         references=["float64"], comparisons=1, seconds=0.01)

    monkeypatch.setattr(selfcheck, "run_selfcheck", fake_run)
    state.ops = SimpleNamespace(__file__="/x/syncbn_cuda_avx512_0123456789ab.so")
    return state


def test_a_pass_is_remembered_per_device_and_build(fake_gpu):
    dev = torch.device("cuda", 0)
    assert selfcheck.ensure_cuda_kernels_checked(dev, "error", ops=fake_gpu.ops)
    assert selfcheck.ensure_cuda_kernels_checked(dev, "error", ops=fake_gpu.ops)
    assert fake_gpu.calls == 1
    data = json.loads(selfcheck.cache_path().read_text())
    assert list(data) == ["Fake GPU | sm_90 | syncbn_cuda_avx512_0123456789ab"] and data[list(data)[0]]["passed"]
    other = SimpleNamespace(__file__="/x/syncbn_cuda_avx512_ba9876543210.so")  # a rebuilt extension
    assert selfcheck.ensure_cuda_kernels_checked(dev, "error", ops=other)
    assert fake_gpu.calls == 2


def test_error_mode_raises_and_remembers_nothing(fake_gpu):
    fake_gpu.fail = True
    for _ in range(2):
        with pytest.raises(selfcheck.SelfCheckError, match="batch_norm_elemt"):
            selfcheck.ensure_cuda_kernels_checked(torch.device("cuda", 0), "error", ops=fake_gpu.ops)
    assert fake_gpu.calls == 2 and not selfcheck.cache_path().exists()


def test_library_check_and_the_layers_first_use_check(fake_gpu, monkeypatch, caplog):
    """check(): this process alone, a report now or None once remembered, SelfCheckError on a disagreement.
    check_first_use (a layer's first CUDA training forward): once per device and process, never after the
    trainer's gate, and SYNCTRAIN_SYNCBN_SELFCHECK=warn|off soften or skip it."""
    monkeypatch.setattr(selfcheck, "_CHECKED", set())
    dev, other = torch.device("cuda", 0), torch.device("cuda", 1)
    assert isinstance(selfcheck.check(dev, ops=fake_gpu.ops), selfcheck.SelfCheckReport)
    assert selfcheck.check(dev, ops=fake_gpu.ops) is None and fake_gpu.calls == 1  # remembered
    fake_gpu.fail = True
    with pytest.raises(selfcheck.SelfCheckError, match="batch_norm_elemt"):
        selfcheck.check(dev, ops=fake_gpu.ops, use_cache=False)
    with pytest.raises(selfcheck.SelfCheckError, match="batch_norm_elemt"):
        selfcheck.check_first_use(other)
    selfcheck.check_first_use(other)  # once per device: the second forward does not check again
    assert fake_gpu.calls == 3
    third, fourth = torch.device("cuda", 2), torch.device("cuda", 3)
    monkeypatch.setenv("SYNCTRAIN_SYNCBN_SELFCHECK", "warn")
    with caplog.at_level(logging.WARNING, logger="src.syncbn.selfcheck"):
        selfcheck.check_first_use(third)
    assert "SYNCTRAIN_SYNCBN_SELFCHECK=warn" in caplog.text and fake_gpu.calls == 4
    monkeypatch.setenv("SYNCTRAIN_SYNCBN_SELFCHECK", "off")
    selfcheck.check_first_use(fourth)
    assert fake_gpu.calls == 4
    fifth, rebuilt = torch.device("cuda", 4), SimpleNamespace(__file__="/x/syncbn_cuda_avx512_ba9876543210.so")
    assert not selfcheck.ensure_cuda_kernels_checked(fifth, "fallback", ops=rebuilt)  # the trainer's gate
    monkeypatch.setenv("SYNCTRAIN_SYNCBN_SELFCHECK", "error")
    selfcheck.check_first_use(fifth)  # decided by the gate: the layers do not check again
    assert fake_gpu.calls == 5
    monkeypatch.setenv("SYNCTRAIN_SYNCBN_SELFCHECK", "sometimes")
    with pytest.raises(ValueError, match="SYNCTRAIN_SYNCBN_SELFCHECK='sometimes': expected error, warn or off"):
        selfcheck.check_first_use(torch.device("cuda", 5))


def test_fallback_mode_warns_and_off_skips(fake_gpu, caplog):
    fake_gpu.fail = True
    with caplog.at_level(logging.WARNING, logger="src.syncbn.selfcheck"):
        assert not selfcheck.ensure_cuda_kernels_checked(torch.device("cuda", 0), "fallback", ops=fake_gpu.ops)
    assert "nn.SyncBatchNorm instead" in caplog.text
    assert selfcheck.ensure_cuda_kernels_checked(torch.device("cuda", 0), "off", ops=fake_gpu.ops)
    assert selfcheck.ensure_cuda_kernels_checked(torch.device("cpu"), "error", ops=fake_gpu.ops)
    assert fake_gpu.calls == 1


def test_fallback_swaps_in_torch_syncbn_with_the_same_tensors(monkeypatch):
    import src.syncbn.selfcheck as module

    monkeypatch.setattr(module, "ensure_cuda_kernels_checked", lambda device, mode: False)
    cfg = NormConfig(name="syncbn", cuda_selfcheck="fallback")
    model = finalize_norms(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)), cfg)
    weight = model[1].weight
    out = checked_cuda_syncbn(model, cfg, torch.device("cuda", 0))
    assert type(out[1]) is nn.SyncBatchNorm and out[1].weight is weight
    kept = finalize_norms(nn.Sequential(nn.BatchNorm2d(4)), cfg)
    assert checked_cuda_syncbn(kept, cfg, torch.device("cpu")) is kept  # CPU: nothing to check


def test_config_key_is_validated_early():
    with pytest.raises(ValueError, match="norm.cuda_selfcheck must be one of error, fallback, off; got 'maybe'"):
        NormConfig(name="syncbn", cuda_selfcheck="maybe").validate(device=None)
    with pytest.raises(ValueError, match="norm.cuda_selfcheck=fallback cannot keep norm.group_size"):
        NormConfig(name="syncbn", cuda_selfcheck="fallback", group_size=2).validate(device=None)
    NormConfig(name="syncbn", cuda_selfcheck="off").validate(device=None)


@pytest.mark.cuda
def test_selfcheck_on_the_gpu_passes_within_a_second(tmp_path, monkeypatch):
    """On a real GPU: our kernels agree with torch.batch_norm_* and float64; warm, under a second; remembered."""
    from src.syncbn.extension import load_extension

    ops = load_extension()
    selfcheck.run_selfcheck(ops, "cuda:0")  # cold: module load, allocator
    report = selfcheck.run_selfcheck(ops, "cuda:0")
    assert "torch.batch_norm_*" in report.references
    assert report.seconds < 1.0, report.summary()
    monkeypatch.setenv("SYNCTRAIN_EXTENSIONS_DIR", str(tmp_path))
    assert selfcheck.ensure_cuda_kernels_checked(torch.device("cuda", 0), "error", ops=ops)
    assert json.loads(selfcheck.cache_path().read_text())
