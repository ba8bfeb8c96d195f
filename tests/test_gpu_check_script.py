"""`make gpu-check` (scripts/gpu_check.sh) off a GPU: it must stop at once, say why in its report, and exit 2;
and, run against fake nvidia-smi / nvcc / compute-sanitizer / python executables (small shell scripts:
tests/support/gpu_fakes.py), its preflight, step order, caps, budget, timeouts, hard stop and report in
every outcome, in at most three files. (shellcheck and `bash -n` of the script:
tests/cluster/test_launch_scripts.py.)"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import torch

from tests.support.gpu_fakes import SCRIPT, default_caps, fake_machine, wheel

REPO = Path(__file__).resolve().parents[1]
# The exchange benchmark is a step when its script is in the checkout, else reported "script missing".
EXCHANGE = (REPO / "scripts" / "bench_exchange_host.py").is_file()
# The steps that decide the verdict first, then those run only if their whole cap still fits.
STEPS = ["build", "selfcheck", "kernel_tests", "train_compare", "occupancy", "sanitizer_memcheck",
         "sanitizer_racecheck", "exchange_host", "bench", "bench_loader", "sanitizer_initcheck",
         "sanitizer_synccheck", "slow_tests"]
ORDER = [s for s in STEPS if EXCHANGE or s != "exchange_host"]  # the steps that run a command
DEFAULT_CAPS = {"build": 120, "selfcheck": 45, "kernel_tests": 100, "train_compare": 100, "occupancy": 20,
                "sanitizer_memcheck": 60, "sanitizer_racecheck": 60, "exchange_host": 100, "bench": 45,
                "bench_loader": 60, "sanitizer_initcheck": 60, "sanitizer_synccheck": 60, "slow_tests": 150}
CAPS_WARNING = "WARNING: the verdict steps' caps"
OUT_FILES = ["logs.tar.gz", "report.json", "summary.txt"]


@pytest.fixture
def fake_gpu_machine(tmp_path):
    """Fake executables and the environment that points the script at them; returns (env, out, log)."""
    return fake_machine(tmp_path, sys.executable), tmp_path / "out", tmp_path / "calls.log"


def _run(env: dict, out: Path, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), str(out)], env={**env, **extra}, capture_output=True, text=True,
                          timeout=120)


def _calls(log: Path) -> list[list[str]]:
    return [line.split("|") for line in log.read_text().splitlines()] if log.exists() else []


def _report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def _steps(out: Path) -> dict[str, dict]:
    return {s["step"]: s for s in _report(out)["steps"]}


def _no_scratch_left(tmp_path: Path) -> bool:
    return not list(tmp_path.glob("gpu_check.*"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: make gpu-check would run for real")
def test_stops_clearly_without_a_gpu_and_reports_it(tmp_path):
    """The real interpreter (a CUDA build of torch, no GPU here): exit 2 at once, and a report that says why."""
    env = {**os.environ, "PYTHON": sys.executable, "TMPDIR": str(tmp_path)}
    proc = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "STOP: no CUDA GPU visible" in proc.stdout and "torch.cuda.is_available() is False" in proc.stdout
    assert "nothing was checked" in (tmp_path / "out" / "summary.txt").read_text()
    report = _report(tmp_path / "out")
    assert report["complete"] is False and report["passed"] is False
    assert report["reason"].startswith("no CUDA GPU visible") and "nothing was checked" in report["reason"]
    assert "command not found" not in report["reason"]  # nvidia-smi absent here: said in words, not bash's
    assert all(s["status"] == "skipped" and "not reached" in s["note"] for s in report["steps"])
    assert sorted(os.listdir(tmp_path / "out")) == OUT_FILES and _no_scratch_left(tmp_path)


def test_make_target_runs_the_script_with_the_out_dir():
    # --no-print-directory: under `make test` the sub-make would otherwise announce its directory.
    proc = subprocess.run(["make", "--no-print-directory", "-n", "gpu-check", "OUT=/tmp/somewhere"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "bash scripts/gpu_check.sh /tmp/somewhere"


def test_steps_run_in_order_under_their_caps_into_three_files(fake_gpu_machine, tmp_path):
    env, out, log = fake_gpu_machine
    out.mkdir()
    (out / "report.json").write_text('{"stale": true}')  # an earlier run's files are never merged
    wheel(tmp_path / "wheels")
    proc = _run(env, out, GPU_CHECK_WHEELS=str(tmp_path / "wheels"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = _calls(log)
    assert [c[0] for c in calls if c[0] != "sanitizer"] == ORDER
    by_step = {c[0]: c for c in calls}
    kernel = by_step["kernel_tests"][2]
    assert "-m pytest -o addopts= -m cuda" in kernel and "--timeout 60" in kernel
    assert "tests/syncbn/test_cuda_kernels.py" in kernel and " tests " not in f" {kernel} "
    assert "tests/data/test_decode_on_device.py" in kernel
    assert "--timeout 120" in by_step["slow_tests"][2] and "tests/syncbn/test_compile.py" in by_step["slow_tests"][2]
    assert "--quick" in by_step["bench"][2] and "--device cuda" in by_step["bench_loader"][2]
    if EXCHANGE:  # scripts/bench_exchange_host.py's command line, its JSON into the scratch folder
        *args, json_out = by_step["exchange_host"][2].split()
        assert args == ["scripts/bench_exchange_host.py", "--device", "cuda", "--world-size", "8", "--model",
                        "resnet50", "--dtype", "bfloat16", "--channels-last", "--batch", "32", "--rounds", "5",
                        "--json"]
        assert json_out.startswith(str(tmp_path / "gpu_check.")) and json_out.endswith("/exchange_host.json")
    sanitizers = [c[1] for c in calls if c[0] == "sanitizer"]
    assert [s.split()[1] for s in sanitizers] == ["memcheck", "racecheck", "initcheck", "synccheck"]
    for tool in ("memcheck", "racecheck", "initcheck", "synccheck"):  # caching allocator off, every case once
        assert by_step[f"sanitizer_{tool}"][1] == "nocache=1"
        assert by_step[f"sanitizer_{tool}"][2].endswith("-m src.syncbn.selfcheck --quick --sanitizer")
    assert all("--report-api-errors no" in s and "--kernel-name kns=syncbn" in s for s in sanitizers)
    assert by_step["selfcheck"][1] == "nocache="
    # Every step appends to the caller's PYTHONPATH: the repository first, the carried wheels' folder last.
    for call in calls:
        if call[0] != "sanitizer":
            path = call[3].removeprefix("PYTHONPATH=").split(":")
            assert path[:2] == [str(REPO), "/caller/path"] and path[-1].startswith(str(tmp_path / "gpu_check.")), call
            assert "carried_probe.py" in call[4], call
    report = _report(out)
    assert report["complete"] is True and report["passed"] is True and "stale" not in report
    assert "reason" not in report and "running" not in report
    steps = _steps(out)
    assert list(steps) == ["preflight"] + STEPS
    if not EXCHANGE:
        assert steps.pop("exchange_host") == {"step": "exchange_host", "status": "skipped", "rc": None, "seconds": 0,
                                              "cap_s": 0, "note": "script missing"}
    assert all(s["status"] == "passed" for s in steps.values())
    assert {name: steps[name]["cap_s"] for name in ORDER} == {name: DEFAULT_CAPS[name] for name in ORDER}
    assert steps["selfcheck"]["result"] == {"passed": True}
    for name in ("bench", "bench_loader") + (("exchange_host",) if EXCHANGE else ()):  # each step's own JSON
        assert steps[name]["result"] == {"fake": name}, name
    assert steps["train_compare"]["partial"] is True and "one GPU" in steps["train_compare"]["note"]
    assert "of the 420s budget left" in proc.stdout and CAPS_WARNING not in proc.stdout
    assert default_caps() == DEFAULT_CAPS  # the rehearsal's --at-caps reads the script's own table
    # Three files, whatever the steps wrote: the logs, the XML and the steps' JSON are in the archive.
    assert sorted(os.listdir(out)) == OUT_FILES and _no_scratch_left(tmp_path)
    with tarfile.open(out / "logs.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"./kernel_tests.log", "./selfcheck.json", "./env.txt", "./steps.tsv",
            "./train_compare/train_compare.json", "./bench_loader.json"} <= names
    assert ("./exchange_host.json" in names) == EXCHANGE


def test_a_step_over_its_cap_is_killed_and_the_others_still_run(fake_gpu_machine):
    """bench ignores SIGTERM: `timeout -k` kills it 1 s after its 1 s cap; a failing step is reported too; a
    cap of 0 skips its step; a cap beyond the budget gives a leading step what is left and skips a step run
    only if time is left."""
    env, out, log = fake_gpu_machine
    proc = _run(env, out, GPU_CHECK_CAPS="bench=1 sanitizer_racecheck=0 kernel_tests=9999 bench_loader=9999",
                GPU_CHECK_KILL_AFTER_S="1",
                FAKE_SLOW="bench", FAKE_IGNORE_TERM="1", FAKE_FAIL="occupancy kernel_tests")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert [c[0] for c in _calls(log) if c[0] != "sanitizer"] == [s for s in ORDER
                                                                   if s not in ("sanitizer_racecheck", "bench_loader")]
    steps = _steps(out)
    assert steps["bench"]["status"] == "timed out" and steps["bench"]["rc"] == 137 and steps["bench"]["cap_s"] == 1
    assert 1 <= steps["bench"]["seconds"] < 30  # the fake sleeps 60 s: KILL ended it (slack for a loaded machine)
    assert steps["sanitizer_racecheck"]["status"] == "skipped" and "cap 0" in steps["sanitizer_racecheck"]["note"]
    assert steps["occupancy"]["status"] == "failed" and steps["kernel_tests"]["status"] == "failed"
    assert 10 <= steps["kernel_tests"]["cap_s"] <= 420 - 1 - 5  # what was left of the budget (whole seconds: bench took >= 1)
    assert steps["bench_loader"]["status"] == "skipped" and "no time left for its 9999s cap" in steps["bench_loader"]["note"]
    assert steps["sanitizer_initcheck"]["status"] == "passed"
    assert steps["slow_tests"]["status"] == "passed"
    report = _report(out)
    assert report["complete"] is True and report["passed"] is False
    assert "FAILED tests/x.py::test_fake" in (out / "summary.txt").read_text()


def test_the_budget_shares_out_what_is_left_and_skips_the_rest(fake_gpu_machine):
    """A 30 s budget: build takes 2 s, selfcheck is cut at what is left after the kill margin (2 s) and the
    report's share (5 s), and every later step is skipped for want of time; the report is complete. (The
    set-up may take up to 11 s on a loaded machine before selfcheck would be skipped instead of cut.)"""
    env, out, log = fake_gpu_machine
    proc = _run(env, out, GPU_CHECK_BUDGET_S="30", GPU_CHECK_KILL_AFTER_S="2", FAKE_SECONDS="build=2",
                FAKE_SLOW="selfcheck")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    steps = _steps(out)
    assert steps["build"]["status"] == "passed"
    limit = steps["selfcheck"]["cap_s"]
    assert steps["selfcheck"]["status"] == "timed out" and 10 <= limit <= 30 - 2 - 5 - 2
    assert all(steps[s]["status"] == "skipped" and "no time left" in steps[s]["note"] for s in ORDER[2:])
    assert steps["exchange_host"]["status"] == "skipped"
    report = _report(out)
    assert report["complete"] is True and report["seconds"] <= 30
    assert CAPS_WARNING in proc.stdout  # the verdict steps' caps do not fit a 30 s budget: said at the start


def test_a_failed_build_skips_the_rest(fake_gpu_machine):
    env, out, log = fake_gpu_machine
    proc = _run(env, out, FAKE_FAIL="build")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert [c[0] for c in _calls(log)] == ["build"]
    steps = _steps(out)
    assert steps["build"]["status"] == "failed"
    assert all(steps[s]["status"] == "skipped" and steps[s]["note"] == "the build failed" for s in STEPS[1:])
    assert _report(out)["passed"] is False


def _start(env: dict, out: Path, log: Path, **extra: str) -> tuple[subprocess.Popen, int]:
    """The script in the background (its own session), once FAKE_SLOW's step is running: (process, the step's
    pid)."""
    proc = subprocess.Popen(["bash", str(SCRIPT), str(out)], env={**env, **extra}, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pid_file = Path(f"{log}.slowpid")
    deadline = time.monotonic() + 180  # the steps before it, on a loaded machine
    while not pid_file.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert pid_file.exists(), proc.communicate()[0]
    return proc, int(pid_file.read_text())


def test_a_signal_ends_the_step_and_still_leaves_a_report(fake_gpu_machine, tmp_path):
    """SIGTERM to the script during kernel_tests: the step is ended and recorded, complete is false."""
    env, out, log = fake_gpu_machine
    proc, slow_pid = _start(env, out, log, FAKE_SLOW="kernel_tests")
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=30)[0]
    assert proc.returncode == 143, output
    with pytest.raises(ProcessLookupError):  # the step's process went with the run
        os.kill(slow_pid, 0)
    report = _report(out)
    assert report["complete"] is False and report["passed"] is False and report["reason"] == "stopped by SIGTERM"
    steps = _steps(out)
    before = ORDER[:ORDER.index("kernel_tests")]
    assert [steps[s]["status"] for s in before] == ["passed"] * len(before)
    assert steps["kernel_tests"]["status"] == "timed out" and "stopped during this step" in steps["kernel_tests"]["note"]
    after = STEPS[STEPS.index("kernel_tests") + 1:]
    assert all(steps[s]["status"] == "skipped" and "not reached" in steps[s]["note"] for s in after)
    assert sorted(os.listdir(out)) == OUT_FILES and _no_scratch_left(tmp_path)


def test_a_hard_kill_leaves_the_report_of_the_last_step(fake_gpu_machine):
    """SIGKILL (no trap runs): the report written after the last finished step is there, names the step that
    was running, and says the run is not complete."""
    env, out, log = fake_gpu_machine
    proc, slow_pid = _start(env, out, log, FAKE_SLOW="sanitizer_memcheck")
    step_group = os.getpgid(slow_pid)  # timeout's own process group
    os.killpg(proc.pid, signal.SIGKILL)  # the script and its watchdog, as a machine taken back would
    os.killpg(step_group, signal.SIGKILL)
    proc.communicate(timeout=30)
    report = _report(out)
    assert report["complete"] is False and report["running"] == "sanitizer_memcheck"
    steps = _steps(out)
    assert steps["kernel_tests"]["status"] == "passed" and steps["sanitizer_memcheck"]["status"] == "skipped"
    with tarfile.open(out / "logs.tar.gz") as tar:
        assert "./kernel_tests.log" in tar.getnames()


def test_the_watchdog_stops_a_hung_setup_at_the_budget(fake_gpu_machine):
    """The probe hangs (a driver call that never returns, say): at the budget the run stops with a report."""
    env, out, log = fake_gpu_machine
    t0 = time.monotonic()
    proc = _run(env, out, GPU_CHECK_BUDGET_S="3", FAKE_PROBE_SLEEP="60")
    assert time.monotonic() - t0 < 40  # well before the probe's 60 s
    assert proc.returncode == 143, proc.stdout + proc.stderr
    report = _report(out)
    assert report["complete"] is False and report["reason"] == "the 3s budget was spent (hard stop)"
    assert _calls(log) == []


def test_preflight_names_everything_missing_before_building(fake_gpu_machine, tmp_path):
    env, out, log = fake_gpu_machine
    proc = _run(env, out, FAKE_NO_DRIVER="1", FAKE_NVCC_RELEASE="12.4", FAKE_INCLUDE=str(tmp_path / "nowhere"),
                CXX="/nonexistent/c++")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    text = proc.stdout
    for part in ("PREFLIGHT: missing: nvidia-smi lists no GPU", "couldn't communicate with the NVIDIA driver",
                 "no CUDA toolkit whose nvcc has torch's CUDA major version (torch.version.cuda = 13.0)",
                 "(nvcc 12.4)", f"Python.h not found in {tmp_path / 'nowhere'}", "apt-get install python3-dev",
                 "C++ compiler '/nonexistent/c++' not found", "nothing was built"):
        assert part in text, (part, text)
    assert _calls(log) == []  # nothing built or run
    report = _report(out)
    assert report["complete"] is False and "the preflight found 4 missing piece(s)" in report["reason"]
    assert report["steps"][0]["step"] == "preflight" and report["steps"][0]["status"] == "failed"
    assert "Python.h" in report["steps"][0]["note"]


def test_a_forgotten_bundle_stops_the_preflight(fake_gpu_machine, tmp_path):
    """A node's Python without hydra and omegaconf (here a bare one: standard library only) and no .whl: the
    preflight names the modules, the files that import them and the way out, before anything is built."""
    env, out, log = fake_gpu_machine
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    proc = _run(env, out, REAL_PYTHON=str(bare / "bin" / "python"), PYTHONPATH="/caller/path")  # no bundle there
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert _calls(log) == []
    report = _report(out)
    note = report["steps"][0]["note"]
    assert report["steps"][0]["status"] == "failed" and "the preflight found 1 missing piece(s)" in report["reason"]
    assert re.search(r"hydra \(imported by [^)]*src/config/\w+\.py", note), note  # the module and files that import it
    for part in ("modules the checks import that", "omegaconf",
                 f"No wheels in {env['GPU_CHECK_WHEELS']}: run make gpu-bundle", "carry .whl with the checkout"):
        assert part in note, (part, note)


# --- scripts/gpu_train_compare.py's own handling (its training needs a GPU) ---------------------------------

def test_train_compare_keeps_the_callers_pythonpath(monkeypatch):
    from scripts import gpu_train_compare

    monkeypatch.setenv("PYTHONPATH", f"/carried/site:{REPO}")
    assert gpu_train_compare.child_env()["PYTHONPATH"] == f"{REPO}:/carried/site"


def test_train_compare_reports_a_run_past_its_timeout(tmp_path):
    """torchrun cannot start training within 0.5 s: the run is ended and reported "timed out", not raised."""
    from scripts import gpu_train_compare

    t0 = time.monotonic()
    assert gpu_train_compare.run_training("syncbn", tmp_path / "run", 1, 1, 0.5) == "timed out"
    assert time.monotonic() - t0 < 20
    assert (tmp_path / "run.log").is_file()


def test_the_loader_benchmark_runs_every_mode(tmp_path):
    """scripts/bench_loader.py (gpu-check's bench_loader step, there on a GPU) on a few images on the CPU."""
    out = tmp_path / "loader.json"
    proc = subprocess.run([sys.executable, "scripts/bench_loader.py", "--images", "16", "--side", "64", "--crop",
                           "48", "--batch-size", "8", "--workers", "0", "--rounds", "1", "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result["images_per_s"]) == {"float32 (workers normalise)", "uint8 (device_transforms)",
                                           "bytes (decode_on_device)"}
    assert all(rate > 0 for rate in result["images_per_s"].values())
    assert result["bytes_per_batch"]["bytes (decode_on_device)"] < result["bytes_per_batch"]["uint8 (device_transforms)"]
