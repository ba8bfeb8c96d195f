"""`make gpu-check` (scripts/gpu_check.sh) off a GPU: it must stop at once with a clear message and exit 2,
having checked nothing; and, run against fake nvidia-smi / nvcc / compute-sanitizer / python executables
(small shell scripts written here), its preflight, step order, caps, timeouts and report.json.
(shellcheck and `bash -n` of the script: tests/cluster/test_launch_scripts.py.)"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.sh"
ORDER = ["build", "selfcheck", "occupancy", "bench", "kernel_tests", "sanitizer_memcheck", "sanitizer_initcheck",
         "sanitizer_racecheck", "sanitizer_synccheck", "train_compare", "slow_tests"]
DEFAULT_CAPS = {"build": 300, "selfcheck": 60, "occupancy": 30, "bench": 60, "kernel_tests": 150,
                "sanitizer_memcheck": 60, "sanitizer_initcheck": 60, "sanitizer_racecheck": 60,
                "sanitizer_synccheck": 60, "train_compare": 150, "slow_tests": 240}

# The fake python: the script's probe gets a GPU machine's answers; gpu_check_report.py runs on the real
# interpreter; a step (GPU_CHECK_STEP in its environment) is logged, then passes, fails (FAKE_FAIL), or sleeps
# (FAKE_SLOW; ignoring SIGTERM with FAKE_IGNORE_TERM=1, so only timeout's KILL ends it).
FAKE_PYTHON = r"""#!/bin/sh
case "$1" in *gpu_check_report.py) exec "$REAL_PYTHON" "$@" ;; esac
if [ -z "${GPU_CHECK_STEP:-}" ]; then
  case "$*" in *gpu_check_probe.py*)
    printf 'include=%s\npytest_timeout=1\nkind=gpu\ntorch=2.14.1+cu130\ncuda=13.0\n' "$FAKE_INCLUDE"
    printf 'gpus=1\nname=Fake_H200\ncap=9.0\n' ;;
  esac
  exit 0
fi
echo "$GPU_CHECK_STEP|nocache=${PYTORCH_NO_CUDA_MEMORY_CACHING:-}|$*" >>"$FAKE_LOG"
if [ "$GPU_CHECK_STEP" = train_compare ]; then mkdir -p "$2" && echo '{"nproc": 1}' >"$2/train_compare.json"; fi
case " ${FAKE_FAIL:-} " in *" $GPU_CHECK_STEP "*) echo "FAILED tests/x.py::test_fake"; exit 1 ;; esac
case " ${FAKE_SLOW:-} " in *" $GPU_CHECK_STEP "*)
  echo $$ >"$FAKE_LOG.slowpid"
  if [ "${FAKE_IGNORE_TERM:-0}" = 1 ]; then trap '' TERM; fi
  exec sleep 60 ;;
esac
exit 0
"""
FAKE_NVIDIA_SMI = """#!/bin/sh
if [ "${FAKE_NO_DRIVER:-0}" = 1 ]; then
  echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."; exit 9
fi
[ "$1" = -L ] && { echo "GPU 0: Fake H200 (UUID: GPU-0)"; exit 0; }
echo "| NVIDIA-SMI 580.00   Driver Version: 580.00   CUDA Version: 13.0 |"
"""
FAKE_NVCC = """#!/bin/sh
echo "Cuda compilation tools, release ${FAKE_NVCC_RELEASE:-13.0}, V13.0.48"
"""
# compute-sanitizer: logged, then runs the program after its options.
FAKE_SANITIZER = """#!/bin/sh
echo "sanitizer|$*" >>"$FAKE_LOG"
while [ "$1" != --error-exitcode ]; do shift; done
shift 2
exec "$@"
"""


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture
def fake_gpu_machine(tmp_path):
    """Fake executables and the environment that points the script at them; returns (env, out, log)."""
    bin_dir, cuda = tmp_path / "bin", tmp_path / "cuda"
    _write(bin_dir / "python", FAKE_PYTHON)
    _write(bin_dir / "nvidia-smi", FAKE_NVIDIA_SMI)
    _write(bin_dir / "ninja", "#!/bin/sh\nexit 0\n")
    _write(cuda / "bin" / "nvcc", FAKE_NVCC)
    _write(cuda / "bin" / "compute-sanitizer", FAKE_SANITIZER)
    _write(cuda / "include" / "cuda_runtime.h", "")
    _write(tmp_path / "include" / "Python.h", "")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": str(bin_dir / "python"),
           "REAL_PYTHON": sys.executable, "CUDA_HOME": str(cuda), "FAKE_INCLUDE": str(tmp_path / "include"),
           "FAKE_LOG": str(tmp_path / "calls.log"), "SYNCTRAIN_EXTENSIONS_DIR": str(tmp_path / "ext")}
    for key in ("FAKE_FAIL", "FAKE_SLOW", "GPU_CHECK_CAPS", "GPU_CHECK_BUDGET_S", "CXX", "TORCH_CUDA_ARCH_LIST"):
        env.pop(key, None)
    return env, tmp_path / "out", tmp_path / "calls.log"


def _run(env: dict, out: Path, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), str(out)], env={**env, **extra}, capture_output=True, text=True,
                          timeout=120)


def _calls(log: Path) -> list[list[str]]:
    return [line.split("|", 2) for line in log.read_text().splitlines()] if log.exists() else []


def _steps(out: Path) -> dict[str, dict]:
    return {s["step"]: s for s in json.loads((out / "report.json").read_text())["steps"]}


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: make gpu-check would run for real")
def test_stops_clearly_without_a_gpu(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], cwd=tmp_path,
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


def test_steps_run_in_order_under_their_caps_into_a_fresh_report(fake_gpu_machine):
    env, out, log = fake_gpu_machine
    out.mkdir()
    (out / "selfcheck.json").write_text('{"stale": true}')  # an earlier run's files are never merged
    (out / "report.json").write_text('{"stale": true}')
    proc = _run(env, out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = _calls(log)
    assert [c[0] for c in calls if c[0] != "sanitizer"] == ORDER
    by_step = {c[0]: c for c in calls}
    kernel = by_step["kernel_tests"][2]
    assert "-m pytest -o addopts= -m cuda" in kernel and "--timeout 60" in kernel
    assert "tests/syncbn/test_cuda_kernels.py" in kernel and " tests " not in f" {kernel} "
    assert "--timeout 120" in by_step["slow_tests"][2] and "tests/syncbn/test_compile.py" in by_step["slow_tests"][2]
    assert "--quick" in by_step["bench"][2]
    for tool in ("memcheck", "initcheck", "racecheck", "synccheck"):  # caching allocator off, every case once
        assert by_step[f"sanitizer_{tool}"][1] == "nocache=1"
        assert by_step[f"sanitizer_{tool}"][2].endswith("-m src.syncbn.selfcheck --quick")
    assert by_step["selfcheck"][1] == "nocache="
    report = json.loads((out / "report.json").read_text())
    assert report["complete"] is True and report["passed"] is True and "stale" not in report
    steps = _steps(out)
    assert list(steps) == ["preflight"] + ORDER
    assert all(s["status"] == "passed" for s in steps.values())
    assert {name: steps[name]["cap_s"] for name in ORDER} == DEFAULT_CAPS
    assert "result" not in steps["selfcheck"]
    assert steps["train_compare"]["partial"] is True and "one GPU" in steps["train_compare"]["note"]
    assert "the 570s budget starts now" in proc.stdout


def test_a_step_over_its_cap_is_killed_and_the_others_still_run(fake_gpu_machine):
    """bench ignores SIGTERM: `timeout -k` kills it 1 s after its 1 s cap; a failing step is reported too."""
    env, out, log = fake_gpu_machine
    t0 = time.monotonic()
    proc = _run(env, out, GPU_CHECK_CAPS="bench=1", GPU_CHECK_KILL_AFTER_S="1", FAKE_SLOW="bench",
                FAKE_IGNORE_TERM="1", FAKE_FAIL="occupancy kernel_tests")
    assert time.monotonic() - t0 < 30
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert [c[0] for c in _calls(log) if c[0] != "sanitizer"] == ORDER
    steps = _steps(out)
    assert steps["bench"]["status"] == "timed out" and steps["bench"]["rc"] == 137 and steps["bench"]["cap_s"] == 1
    assert 1 <= steps["bench"]["seconds"] <= 5
    assert steps["occupancy"]["status"] == "failed" and steps["kernel_tests"]["status"] == "failed"
    assert steps["slow_tests"]["status"] == "passed"
    report = json.loads((out / "report.json").read_text())
    assert report["complete"] is True and report["passed"] is False
    assert "FAILED tests/x.py::test_fake" in (out / "summary.txt").read_text()


def test_a_failed_build_skips_the_rest(fake_gpu_machine):
    env, out, log = fake_gpu_machine
    proc = _run(env, out, FAKE_FAIL="build")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert [c[0] for c in _calls(log)] == ["build"]
    steps = _steps(out)
    assert steps["build"]["status"] == "failed"
    assert all(steps[s]["status"] == "skipped" and steps[s]["note"] == "the build failed" for s in ORDER[1:])
    assert json.loads((out / "report.json").read_text())["passed"] is False


def test_a_killed_run_still_leaves_a_report(fake_gpu_machine):
    """SIGTERM to the script during kernel_tests: the step is ended and recorded, complete is false."""
    env, out, log = fake_gpu_machine
    proc = subprocess.Popen(["bash", str(SCRIPT), str(out)], env={**env, "FAKE_SLOW": "kernel_tests"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pid_file = Path(f"{log}.slowpid")
    deadline = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert pid_file.exists(), proc.communicate()[0]
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=30)[0]
    assert proc.returncode == 143, output
    slow_pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # the step's process went with the run
        os.kill(slow_pid, 0)
    report = json.loads((out / "report.json").read_text())
    assert report["complete"] is False and report["passed"] is False
    steps = _steps(out)
    assert [steps[s]["status"] for s in ORDER[:4]] == ["passed"] * 4
    assert steps["kernel_tests"]["status"] == "timed out" and "stopped (signal)" in steps["kernel_tests"]["note"]
    assert all(steps[s]["status"] == "skipped" and "not reached" in steps[s]["note"] for s in ORDER[5:])


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
    report = json.loads((out / "report.json").read_text())
    assert report["complete"] is False
    assert report["steps"][0]["step"] == "preflight" and report["steps"][0]["status"] == "failed"
    assert "Python.h" in report["steps"][0]["note"]
