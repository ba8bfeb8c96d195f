"""The SyncBN CUDA self-check (src/syncbn/selfcheck.py): the same run_selfcheck a GPU user gets, here on the
emulated build (it must pass) and on the deliberately faulty emulated variant (it must name the wrong op);
and the gate around it (the modes, the on-disk memory), with the check itself stubbed so no GPU is needed.
Only src.syncbn is imported: the GPU check runs this file on a GPU node, which may lack Hydra (the
trainer's side of the gate, norm.cuda_selfcheck and the fallback to nn.SyncBatchNorm: tests/models/
test_norms_selfcheck.py)."""
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

from src.syncbn import functions, selfcheck
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
def test_device_cases_are_sized_from_the_kernels_occupancy():
    """kernel_occupancy() (here the emulated device's model, given ptxas's sm_90 registers of the stats kernels:
    56 for fp32 and 112 for bf16, so 4 and 2 blocks of 256 per SM) sizes the channels-last device case for
    an H200 at 3 x 64 x 528 = 3 x 128 x 264 rows: a quarter of the size the thread slots alone would give."""
    from src.syncbn.extension import load_emulated_cuda_extension

    emu = load_emulated_cuda_extension("h100,registers.stats_channels_last_kernel<float, 4>=56,"
                                       "registers.stats_channels_last_kernel<c10::BFloat16, 8>=112")
    try:
        table = emu.kernel_occupancy()
    finally:
        emu.set_device("h100")
    entries = {e["kernel"]: e for e in table}
    assert entries["stats_channels_last<float,4>"]["registers"] == 56
    assert entries["stats_channels_last<bfloat16,8>"]["launch_name"] == "stats_channels_last_kernel<c10::BFloat16, 8>"
    resident = sc.stats_resident_blocks(table, 132, 2048)
    assert resident == {torch.float32: 528, torch.float16: 264, torch.bfloat16: 264, torch.float64: 1056}
    split_n, unroll = sc.device_cases(resident)
    assert unroll.shape == (2, 16, 1585, 32) and 64 * 1585 > 3 * 128 * 264 >= 64 * 1584
    by_slots = sc.device_cases(sc.resident_blocks(132, 2048))[1]
    assert by_slots.shape[2] == 4 * 1584 + 1  # 2 x 16 x 6337 x 32: 6.5M elements instead of 1.6M


@pytest.mark.cuda_emulated
def test_staged_inputs_give_the_same_comparisons():
    """--sanitizer's staging (inputs made on the CPU and copied) runs the same chain and comparisons."""
    from src.syncbn.extension import load_emulated_cuda_extension

    emu = load_emulated_cuda_extension("h100")
    case = (sc.CASES[1],)  # channels_last with an empty rank
    with one_intraop_thread():
        plain = selfcheck.run_selfcheck(emu, "cpu", cases=case, dtypes=(torch.float32,))
        staged = selfcheck.run_selfcheck(emu, "cpu", cases=case, dtypes=(torch.float32,), staged=True)
    assert staged.comparisons == plain.comparisons == 6 * 3 + 10  # test_selfcheck_passes_on_the_emulated_build's count


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
    # The layers' kernels, as check() loads them when not given any (no build into the empty cache above): a
    # build of their own, whose pass nothing above remembers.
    layers = SimpleNamespace(module=SimpleNamespace(__file__="/x/syncbn_cuda_avx512_aaaaaaaaaaaa.so"))
    monkeypatch.setattr(functions, "kernel_ops", lambda: layers)
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


@pytest.mark.cuda
def test_selfcheck_on_the_gpu_passes_and_its_fixed_cases_take_under_a_second(tmp_path, monkeypatch):
    """On a real GPU: our kernels agree with torch.batch_norm_* and float64 in every case, the device-sized ones
    sized from the kernels' own occupancy (registers counted: never more resident blocks than the thread slots
    allow); warm, the four fixed cases take under a second (the device-sized ones are timed apart: their
    float64 reference is CPU work that grows with the GPU); a pass is remembered."""
    from src.syncbn.extension import load_extension

    ops = load_extension()
    props = torch.cuda.get_device_properties(0)
    slots = sc.resident_blocks(props.multi_processor_count, props.max_threads_per_multi_processor)
    resident = sc.stats_resident_blocks(ops.kernel_occupancy(0), props.multi_processor_count,
                                        props.max_threads_per_multi_processor)
    assert all(0 < r <= slots for r in resident.values()), resident
    cases = selfcheck.default_cases(torch.device("cuda", 0), ops)
    assert cases == sc.CASES + sc.device_cases(resident)
    everything = selfcheck.run_selfcheck(ops, "cuda:0")  # cold: module load, allocator
    assert "torch.batch_norm_*" in everything.references and everything.cases == [c.name for c in cases]
    fixed = selfcheck.run_selfcheck(ops, "cuda:0", cases=sc.CASES)
    assert fixed.seconds < 1.0, fixed.summary()
    print(f"every case: {everything.seconds:.2f} s cold; the fixed ones: {fixed.seconds:.2f} s warm")
    monkeypatch.setenv("SYNCTRAIN_EXTENSIONS_DIR", str(tmp_path))
    assert selfcheck.ensure_cuda_kernels_checked(torch.device("cuda", 0), "error", ops=ops)
    assert json.loads(selfcheck.cache_path().read_text())
