"""A GPU machine faked with shell scripts, for `make gpu-check` (scripts/gpu_check.sh) without a GPU: nvidia-smi,
nvcc, compute-sanitizer, ninja, Python.h and a python that answers the script's probe like a GPU node's and
runs no step for real (tests/test_gpu_check_script.py). As a program it rehearses a whole run, each step
taking the time given to it, to show what the budget gives each step and what comes back:

    python -m tests.support.gpu_fakes OUT [--python PY] [--seconds "build=60 selfcheck=15 ..."] [--budget 420]
    python -m tests.support.gpu_fakes OUT [--python PY] --at-caps 0.8   # every step at 80 % of its default cap

PY runs the report, pip (the carried wheels are installed for real, from .whl) and the preflight's import
check: the node-like environment of `make test-compat` (.venv-compat/bin/python) rehearses with the node's
PyTorch, and without .whl its preflight stops as a node's would.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.sh"

# The fake python: the script's probe gets a GPU machine's answers (after FAKE_PROBE_SLEEP seconds); pip,
# gpu_check_report.py and the preflight's import check (gpu_imports.py) run on the real interpreter; a step (GPU_CHECK_STEP in its environment) is logged with
# its PYTHONPATH and what the carried-wheels folder holds, then takes FAKE_SECONDS' seconds for it, then
# passes, fails (FAKE_FAIL), or sleeps (FAKE_SLOW; ignoring SIGTERM with FAKE_IGNORE_TERM=1, so only
# timeout's KILL ends it).
FAKE_PYTHON = r"""#!/bin/bash
case "$1" in *gpu_check_report.py|*gpu_imports.py) exec "$REAL_PYTHON" "$@" ;; esac
if [ "$1 $2" = "-m pip" ]; then exec "$REAL_PYTHON" "$@"; fi
if [ -z "${GPU_CHECK_STEP:-}" ]; then
  case "$*" in *gpu_check_probe.py*)
    sleep "${FAKE_PROBE_SLEEP:-0}"
    printf 'include=%s\npytest_timeout=1\nkind=%s\ntorch=2.11.0+cu130\ncuda=13.0\n' "$FAKE_INCLUDE" "${FAKE_KIND:-gpu}"
    [ "${FAKE_KIND:-gpu}" = gpu ] && printf 'gpus=1\nname=Fake_H200\ncap=9.0\n' ;;
  esac
  exit 0
fi
site=${PYTHONPATH##*:}
echo "$GPU_CHECK_STEP|nocache=${PYTORCH_NO_CUDA_MEMORY_CACHING:-}|$*|PYTHONPATH=$PYTHONPATH|site=$(ls "$site" 2>/dev/null | tr '\n' ' ')" >>"$FAKE_LOG"
if [ "$GPU_CHECK_STEP" = train_compare ]; then mkdir -p "$2" && echo '{"nproc": 1}' >"$2/train_compare.json"; fi
if [ "$GPU_CHECK_STEP" = selfcheck ]; then echo '{"passed": true}' >"$4"; fi
# A step's --json OUT (the benchmarks) gets a JSON naming the step, for the report to attach.
prev=""; for a in "$@"; do [ "$prev" = --json ] && [ "$GPU_CHECK_STEP" != selfcheck ] && echo "{\"fake\": \"$GPU_CHECK_STEP\"}" >"$a"; prev=$a; done
for kv in ${FAKE_SECONDS:-}; do [ "${kv%%=*}" = "$GPU_CHECK_STEP" ] && sleep "${kv#*=}"; done
case " ${FAKE_FAIL:-} " in *" $GPU_CHECK_STEP "*) echo "FAILED tests/x.py::test_fake"; exit 1 ;; esac
case " ${FAKE_SLOW:-} " in *" $GPU_CHECK_STEP "*)
  echo $$ >"$FAKE_LOG.slowpid.tmp" && mv "$FAKE_LOG.slowpid.tmp" "$FAKE_LOG.slowpid"  # whole, once there
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


def write_executable(path: Path, text: str) -> None:
    """`text` as an executable file at `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


def wheel(folder: Path) -> Path:
    """A one-module pure-Python wheel (carried_probe), as make gpu-bundle would leave in .whl."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "carried_probe-1.0-py3-none-any.whl"
    info = "carried_probe-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr("carried_probe.py", "VALUE = 1\n")
        whl.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: carried-probe\nVersion: 1.0\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")
    return path


def fake_machine(root: Path, real_python: str) -> dict[str, str]:
    """The fake executables under `root`, and the environment that points gpu_check.sh at them (the scratch
    folder in `root`, no carried wheels, a caller's PYTHONPATH of /caller/path, then this process's own: under
    `make test-compat` the bundle, which the preflight's import check needs)."""
    bin_dir, cuda = root / "bin", root / "cuda"
    write_executable(bin_dir / "python", FAKE_PYTHON)
    write_executable(bin_dir / "nvidia-smi", FAKE_NVIDIA_SMI)
    write_executable(bin_dir / "ninja", "#!/bin/sh\nexit 0\n")
    write_executable(cuda / "bin" / "nvcc", FAKE_NVCC)
    write_executable(cuda / "bin" / "compute-sanitizer", FAKE_SANITIZER)
    write_executable(cuda / "include" / "cuda_runtime.h", "")
    write_executable(root / "include" / "Python.h", "")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": str(bin_dir / "python"),
           "REAL_PYTHON": real_python, "CUDA_HOME": str(cuda), "FAKE_INCLUDE": str(root / "include"),
           "FAKE_LOG": str(root / "calls.log"), "SYNCTRAIN_EXTENSIONS_DIR": str(root / "ext"),
           "GPU_CHECK_WHEELS": str(root / "no_wheels"), "TMPDIR": str(root),
           "PYTHONPATH": ":".join(["/caller/path", *filter(None, [os.environ.get("PYTHONPATH")])])}
    for key in ("FAKE_FAIL", "FAKE_SLOW", "FAKE_SECONDS", "GPU_CHECK_CAPS", "GPU_CHECK_BUDGET_S", "CXX",
                "TORCH_CUDA_ARCH_LIST"):
        env.pop(key, None)
    return env


def default_caps() -> dict[str, int]:
    """Each step's default cap in seconds, as gpu_check.sh declares them (its `declare -A CAP=(...)`)."""
    text = SCRIPT.read_text()
    declared = text[text.index("declare -A CAP=("):]
    declared = declared[: declared.index(")\n")]
    return {name: int(cap) for name, cap in re.findall(r"\[(\w+)\]=(\d+)", declared)}


def main(argv: list[str] | None = None) -> int:
    """Rehearse one gpu-check run on the fake machine; print its summary and what came back."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--python", default=sys.executable, help="runs the report and pip (default: this one)")
    parser.add_argument("--seconds", default="", help='each step\'s time, "name=seconds ..."')
    parser.add_argument("--at-caps", type=float, metavar="FRACTION",
                        help="each step takes FRACTION of its default cap (whole seconds); --seconds then overrides")
    parser.add_argument("--budget", type=int, default=None, help="GPU_CHECK_BUDGET_S (default: the script's)")
    args = parser.parse_args(argv)
    seconds = {name: int(cap * args.at_caps) for name, cap in default_caps().items()} if args.at_caps else {}
    seconds.update(kv.split("=", 1) for kv in args.seconds.split())
    root = args.out.resolve().parent / (args.out.name + ".machine")
    env = fake_machine(root, args.python)
    env.update(FAKE_SECONDS=" ".join(f"{name}={t}" for name, t in seconds.items()), GPU_CHECK_WHEELS=str(REPO / ".whl"))
    if args.budget is not None:
        env["GPU_CHECK_BUDGET_S"] = str(args.budget)
    started = time.monotonic()
    proc = subprocess.run(["bash", str(SCRIPT), str(args.out)], env=env, text=True)
    files = sorted(p.relative_to(args.out).as_posix() for p in args.out.rglob("*") if p.is_file())
    print(f"rehearsal: exit status {proc.returncode} after {time.monotonic() - started:.0f} s; "
          f"{len(files)} files in {args.out}: {', '.join(files)}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
