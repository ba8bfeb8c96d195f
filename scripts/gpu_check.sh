#!/usr/bin/env bash
# GPU validation in one go (`make gpu-check OUT=DIR`, docs/gpu.md): build the SyncBN extension for this GPU,
# self-check the kernels against PyTorch's, run the tests marked `cuda`, compute-sanitizer (racecheck,
# synccheck, memcheck, initcheck) on small cases, a float64 training step-compare of norm=syncbn against
# norm=torch_syncbn over NCCL, the benchmark against PyTorch's kernels and the occupancy of every kernel.
#
#   bash scripts/gpu_check.sh OUTDIR
#
# Made for a bare, offline GPU box with a time limit:
# - Python: $PYTHON if set, else ./.venv/bin/python, else the system python3: the first with a CUDA build of
#   torch. If it sees no GPU the script stops at once (exit 2) saying so. No CUDA torch at all: it creates
#   .venv from requirements.txt (needs network).
# - Wheels carried in ./.whl (e.g. hydra-core, omegaconf for the trainer's tests) are installed offline
#   into a scratch site dir first.
# - Every step has its own timeout and the whole run a budget (GPU_CHECK_BUDGET_S, default 570 s): a step
#   gets at most what is left, so the script ends within 10 minutes; a failing or skipped step is reported
#   and the others still run.
# Writes to OUTDIR: report.json (every step: status, rc, seconds, its numbers), summary.txt (what it
# printed), env.txt, and one <step>.log per step plus the steps' own JSON files.
# Exit status: 0 when every step that ran passed; 1 otherwise; 2 when there is no GPU.
set -uo pipefail

OUTDIR=${1:?usage: scripts/gpu_check.sh OUTDIR}
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
cd "$(dirname "$0")/.." || exit 2
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
BUDGET_S=${GPU_CHECK_BUDGET_S:-570}
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
log() { echo "[gpu_check +$(elapsed)s] $*" | tee -a "$OUTDIR/summary.txt"; }
: > "$OUTDIR/summary.txt"
: > "$OUTDIR/steps.tsv"

# --- Python with a CUDA torch -------------------------------------------------------------------------
# One probe per candidate: "gpu" (CUDA torch, GPU visible), "nogpu" (CUDA torch, no GPU), "cpu" (CPU-only
# torch build), nothing (no torch). The first CUDA torch decides: without a GPU there is nothing to check.
probe() { "$1" -c 'import torch; print("gpu" if torch.cuda.is_available() else ("nogpu" if torch.version.cuda else "cpu"), torch.__version__, torch.version.cuda)' 2>/dev/null | tail -1; }
PY=""
for cand in "${PYTHON:-}" ./.venv/bin/python "$(command -v python3 || true)"; do
  [ -n "$cand" ] && [ -x "$cand" ] || continue
  read -r kind version cuda <<<"$(probe "$cand")"
  if [ "${kind:-}" = gpu ]; then PY=$cand; break; fi
  if [ "${kind:-}" = nogpu ]; then
    smi=$(nvidia-smi -L 2>&1 | head -3 || true)
    log "STOP: no CUDA GPU visible: torch.cuda.is_available() is False in $cand (torch $version, CUDA $cuda); nvidia-smi: ${smi:-not found}. Run make gpu-check on a machine with an NVIDIA GPU and its driver (CUDA_VISIBLE_DEVICES must not hide it); nothing was checked."
    exit 2
  fi
done
if [ -z "$PY" ]; then
  log "no Python with a CUDA torch found; creating .venv from requirements.txt (needs network)"
  python3 -m venv .venv && .venv/bin/python -m pip install -q -r requirements.txt >>"$OUTDIR/env.txt" 2>&1 \
    && [ "$(probe .venv/bin/python | cut -d' ' -f1)" = gpu ] && PY=.venv/bin/python
  if [ -z "$PY" ]; then log "STOP: no usable Python with a CUDA torch and a GPU (see env.txt); nothing was checked."; exit 2; fi
fi
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu_check_site \
    .whl/*.whl >>"$OUTDIR/env.txt" 2>&1 && export PYTHONPATH="$PYTHONPATH:/tmp/gpu_check_site"
fi
{
  echo "python: $PY"; "$PY" -c 'import sys, torch; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0), "gpus", torch.cuda.device_count())'
  nvidia-smi 2>&1 | head -20
  command -v nvcc && nvcc --version | tail -2
  "$PY" -m pip list 2>/dev/null | grep -iE '^(torch|ninja|pytest|hydra|omegaconf|numpy) '
} >>"$OUTDIR/env.txt" 2>&1
# The chosen environment's own tools (ninja, pytest's console scripts) first: it is not activated here.
PATH="$(dirname "$PY"):$PATH"
export PATH
log "python: $PY ($("$PY" -c 'import torch; print(torch.__version__, torch.cuda.get_device_name(0), "x", torch.cuda.device_count())' 2>/dev/null))"

# --- Toolchain for the build ---------------------------------------------------------------------------
if [ -z "${TORCH_CUDA_ARCH_LIST:-}" ]; then
  TORCH_CUDA_ARCH_LIST=$("$PY" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability(0))')
fi
export TORCH_CUDA_ARCH_LIST
if [ -z "${CUDA_HOME:-}" ]; then  # a toolkit root with headers (nvcc on PATH may be a wrapper script)
  for d in "$(dirname "$(dirname "$(readlink -f "$(command -v nvcc || echo /nonexistent)")")")" /usr/local/cuda; do
    if [ -x "$d/bin/nvcc" ] && [ -f "$d/include/cuda_runtime.h" ]; then export CUDA_HOME=$d; break; fi
  done
fi
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
export SYNCTRAIN_EXTENSIONS_DIR=${SYNCTRAIN_EXTENSIONS_DIR:-$PWD/build/torch_extensions}
SANITIZER=""
for s in "${CUDA_HOME:-/nonexistent}/bin/compute-sanitizer" "$(command -v compute-sanitizer || true)"; do
  if [ -n "$s" ] && [ -x "$s" ]; then SANITIZER=$s; break; fi
done

# --- Step runner ---------------------------------------------------------------------------------------
# step NAME TIMEOUT_S CMD...: runs CMD with the smaller of TIMEOUT_S and what is left of the budget, output in
# NAME.log; records "NAME<TAB>status<TAB>rc<TAB>seconds" in steps.tsv. Never stops the script.
FAILED=0
step() {
  local name=$1 want=$2; shift 2
  local left=$(( BUDGET_S - $(elapsed) - 5 ))
  local limit=$(( want < left ? want : left ))
  if [ "$limit" -lt 10 ]; then
    printf '%s\tskipped\t-\t0\tno time left in the %ss budget\n' "$name" "$BUDGET_S" >>"$OUTDIR/steps.tsv"
    log "$name: SKIPPED (no time left in the ${BUDGET_S}s budget)"
    return 0
  fi
  local s0 rc status
  s0=$(date +%s)
  timeout "$limit" "$@" >"$OUTDIR/$name.log" 2>&1
  rc=$?
  status=passed
  if [ "$rc" -eq 124 ]; then status=timeout; elif [ "$rc" -ne 0 ]; then status=failed; fi
  [ "$status" = passed ] || FAILED=1
  printf '%s\t%s\t%s\t%s\t\n' "$name" "$status" "$rc" "$(( $(date +%s) - s0 ))" >>"$OUTDIR/steps.tsv"
  log "$name: ${status^^} (rc=$rc, $(( $(date +%s) - s0 ))s, limit ${limit}s; $OUTDIR/$name.log)"
  tail -n 4 "$OUTDIR/$name.log" | sed 's/^/    /' | tee -a "$OUTDIR/summary.txt"
  return 0
}
skip() {  # skip NAME REASON
  printf '%s\tskipped\t-\t0\t%s\n' "$1" "$2" >>"$OUTDIR/steps.tsv"
  log "$1: SKIPPED ($2)"
}

# 1. Build exactly the variant training uses here (CUDA + CPU ops in one library); without a usable nvcc the
#    loader would build the CPU-only variant: the step fails then, with the loader's reason.
step build 240 "$PY" -c 'from src.syncbn import extension as e; m = e.load_extension(); print(m.__file__, e.last_build_info()); p = e.cuda_kernels_problem(); assert p is None, p'
BUILT=$(awk -F'\t' '$1 == "build" {print $2}' "$OUTDIR/steps.tsv")
if [ "$BUILT" != passed ]; then
  tail -40 "$OUTDIR/build.log"
  for s in selfcheck pytest_cuda sanitizer_racecheck sanitizer_synccheck sanitizer_memcheck sanitizer_initcheck \
           train_compare bench occupancy; do skip "$s" "the build failed"; done
else
  # 2. The self-check a training process runs (all cases and dtypes), timed cold and warm.
  step selfcheck 90 "$PY" -m src.syncbn.selfcheck --json "$OUTDIR/selfcheck.json"
  # 3. Every test marked cuda.
  step pytest_cuda 180 "$PY" -m pytest -m cuda -q -p no:cacheprovider --continue-on-collection-errors \
    --junitxml="$OUTDIR/pytest_cuda.xml" tests
  grep -E '^(FAILED|ERROR) ' "$OUTDIR/pytest_cuda.log" | head -30 | tee -a "$OUTDIR/summary.txt"
  # 4. compute-sanitizer on our kernels only (kernel names contain "syncbn"), on the quick self-check cases.
  for tool in racecheck synccheck memcheck initcheck; do
    if [ -z "$SANITIZER" ]; then skip "sanitizer_$tool" "compute-sanitizer not found (CUDA_HOME=${CUDA_HOME:-unset})"; continue; fi
    step "sanitizer_$tool" 60 "$SANITIZER" --tool "$tool" --kernel-name kns=syncbn --error-exitcode 7 \
      "$PY" -m src.syncbn.selfcheck --quick
  done
  # 5. A few float64 training steps, norm=syncbn vs norm=torch_syncbn over NCCL (2 processes on 2+ GPUs).
  step train_compare 240 "$PY" scripts/gpu_train_compare.py "$OUTDIR/train_compare" --steps 6 --timeout 110
  # 6. Benchmark against PyTorch's kernels (its own correctness columns are in the JSON).
  step bench 90 "$PY" scripts/bench_syncbn_cuda.py --json "$OUTDIR/bench_syncbn_cuda.json"
  # 7. Resident blocks per SM of every kernel (cudaOccupancyMaxActiveBlocksPerMultiprocessor).
  step occupancy 30 "$PY" scripts/gpu_occupancy.py "$OUTDIR/occupancy.json"
fi

# --- One JSON report ------------------------------------------------------------------------------------
"$PY" - "$OUTDIR" "$(elapsed)" "$BUDGET_S" <<'EOF' | tee -a "$OUTDIR/summary.txt"
import json, sys
from pathlib import Path

out, total, budget = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
steps = []
for line in (out / "steps.tsv").read_text().splitlines():
    name, status, rc, seconds, note = (line.split("\t") + [""] * 5)[:5]
    entry = {"step": name, "status": status, "rc": None if rc == "-" else int(rc), "seconds": int(seconds)}
    if note:
        entry["note"] = note
    steps.append(entry)
attached = {"selfcheck": "selfcheck.json", "train_compare": "train_compare/train_compare.json",
            "bench": "bench_syncbn_cuda.json", "occupancy": "occupancy.json"}
for entry in steps:
    path = out / attached.get(entry["step"], "-")
    if path.is_file():
        try:
            entry["result"] = json.loads(path.read_text())
        except ValueError:
            entry["result"] = "unreadable: " + str(path)
env = (out / "env.txt").read_text() if (out / "env.txt").is_file() else ""
report = {"seconds": total, "budget_s": budget, "passed": all(s["status"] in ("passed", "skipped") for s in steps),
          "steps": steps, "env": env.splitlines()[:12]}
(out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
print(f"gpu_check: {sum(s['status'] == 'passed' for s in steps)} passed, "
      f"{sum(s['status'] in ('failed', 'timeout') for s in steps)} failed, "
      f"{sum(s['status'] == 'skipped' for s in steps)} skipped in {total}s -> {out / 'report.json'}")
for s in steps:
    print(f"  {s['step']:<22} {s['status']:<8} {s['seconds']:>4}s {s.get('note', '')}")
EOF
exit "$FAILED"
