#!/usr/bin/env bash
# GPU validation in one go (`make gpu-check`, docs/gpu.md): build the SyncBN extension for this GPU, run the tests
# marked `cuda`, benchmark our kernels against PyTorch's, and leave logs + JSON in OUTDIR.
#
#   bash scripts/gpu_check.sh OUTDIR
#
# Made for a bare, offline GPU box with a time limit (< 8 minutes end to end on an H200):
# - Python: $PYTHON if set, else ./.venv/bin/python, else the system python3, whichever imports torch
#   and sees a GPU; failing all three it creates .venv from requirements.txt (needs network).
# - Wheels carried in ./.whl (e.g. hydra-core, omegaconf for the trainer's tests) are installed offline
#   into a scratch site dir first; without them, test files that need missing packages are reported as
#   collection errors and the rest still runs.
# - Every stage has its own timeout (build 200 s, tests 180 s, benchmark 90 s), so a hang costs one stage
#   and the whole script stays under 8 minutes.
# Writes (7 files, flat): env.txt build.log pytest_cuda.log pytest_cuda.xml bench.log
# bench_syncbn_cuda.json summary.txt. Exit status: 0 when the build and the tests passed.
set -uo pipefail

OUTDIR=${1:?usage: scripts/gpu_check.sh OUTDIR}
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
cd "$(dirname "$0")/.." || exit 2
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
log() { echo "[gpu_check +$(elapsed)s] $*" | tee -a "$OUTDIR/summary.txt"; }
: > "$OUTDIR/summary.txt"

# --- Python with a CUDA torch -------------------------------------------------------------------------
has_cuda_torch() { "$1" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; }
PY=""
for cand in "${PYTHON:-}" ./.venv/bin/python "$(command -v python3 || true)"; do
  if [ -n "$cand" ] && [ -x "$cand" ] && has_cuda_torch "$cand"; then PY=$cand; break; fi
done
if [ -z "$PY" ]; then
  log "no Python with a CUDA-enabled torch found; creating .venv from requirements.txt (needs network)"
  python3 -m venv .venv && .venv/bin/python -m pip install -q -r requirements.txt >>"$OUTDIR/env.txt" 2>&1 \
    && has_cuda_torch .venv/bin/python && PY=.venv/bin/python
  if [ -z "$PY" ]; then log "FAILED: no usable Python with CUDA torch (see env.txt)"; exit 1; fi
fi
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu_check_site \
    .whl/*.whl >>"$OUTDIR/env.txt" 2>&1 && export PYTHONPATH="$PYTHONPATH:/tmp/gpu_check_site"
fi
{
  echo "python: $PY"; "$PY" -c 'import sys, torch; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))'
  nvidia-smi 2>&1 | head -20
  command -v nvcc && nvcc --version | tail -2
  "$PY" -m pip list 2>/dev/null | grep -iE '^(torch|ninja|pytest|hydra|omegaconf|numpy) '
} >>"$OUTDIR/env.txt" 2>&1
log "python: $PY ($("$PY" -c 'import torch; print(torch.__version__, torch.cuda.get_device_name(0))' 2>/dev/null))"

# --- Build for this GPU --------------------------------------------------------------------------------
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
B0=$(date +%s)
# The loader builds (and imports) exactly the variant training uses here: CUDA + CPU ops in one library.
# (`python -m src.syncbn.build --cuda` would also build a CPU-only variant, which nothing here needs.)
# Without a usable nvcc it would build the CPU-only variant: stop then, with the loader's reason.
timeout 200 "$PY" -c 'from src.syncbn import extension as e; m = e.load_extension(); print(m.__file__, e.last_build_info()); p = e.cuda_kernels_problem(); assert p is None, p' \
  >"$OUTDIR/build.log" 2>&1
BUILD_RC=$?
BUILD_S=$(( $(date +%s) - B0 ))
log "build (TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST, MAX_JOBS=$MAX_JOBS): rc=$BUILD_RC in ${BUILD_S}s"
if [ $BUILD_RC -ne 0 ]; then tail -40 "$OUTDIR/build.log"; log "FAILED: build (see build.log)"; exit 1; fi

# --- Tests marked cuda ---------------------------------------------------------------------------------
timeout 180 "$PY" -m pytest -m cuda -q -p no:cacheprovider --continue-on-collection-errors \
  --junitxml="$OUTDIR/pytest_cuda.xml" tests >"$OUTDIR/pytest_cuda.log" 2>&1
TEST_RC=$?
log "pytest -m cuda: rc=$TEST_RC; $(grep -E '(passed|failed|error|skipped)' "$OUTDIR/pytest_cuda.log" | tail -1)"
grep -E '^(FAILED|ERROR) ' "$OUTDIR/pytest_cuda.log" | head -30 | tee -a "$OUTDIR/summary.txt"

# --- Benchmark -----------------------------------------------------------------------------------------
timeout 90 "$PY" scripts/bench_syncbn_cuda.py --json "$OUTDIR/bench_syncbn_cuda.json" >"$OUTDIR/bench.log" 2>&1
BENCH_RC=$?
log "benchmark: rc=$BENCH_RC"
cat "$OUTDIR/bench.log" | tee -a "$OUTDIR/summary.txt"

log "done in $(elapsed)s: build rc=$BUILD_RC (${BUILD_S}s), tests rc=$TEST_RC, bench rc=$BENCH_RC"
[ $BUILD_RC -eq 0 ] && [ $TEST_RC -eq 0 ]
