#!/usr/bin/env bash
# GPU validation in one go (`make gpu-check OUT=DIR`, docs/gpu.md): build the SyncBN extension for this GPU,
# self-check the kernels against PyTorch's, the occupancy of every kernel, a quick benchmark, the kernel
# tests marked `cuda`, compute-sanitizer on the self-check, a float64 training step-compare of norm=syncbn
# against norm=torch_syncbn over NCCL, then the slower multi-process and compile `cuda` tests.
#
#   bash scripts/gpu_check.sh OUTDIR
#
# Made for a bare, offline GPU box with a time limit, to work the first time:
# - Python: $PYTHON if set, else ./.venv/bin/python, else the system python3: the first with a CUDA build of
#   torch (an existing torch is reused). If it sees no GPU the script stops at once (exit 2) saying so. No
#   CUDA torch at all: it creates .venv with torch from the PyTorch index matching this machine's CUDA
#   (GPU_CHECK_TORCH_INDEX overrides), then requirements.txt (needs network).
# - Wheels carried in ./.whl (e.g. hydra-core, omegaconf for the trainer's tests) are installed offline
#   into a scratch site dir first.
# - A preflight of a few seconds (driver and nvidia-smi, the GPU, an nvcc whose major version is torch's
#   CUDA, Python.h, the C++ compiler, ninja) names everything missing and stops (exit 3) before any build.
# - The budget (GPU_CHECK_BUDGET_S, default 570 s) starts after that setup. Steps run cheapest and most
#   telling first, each under its own cap (`timeout -k`; GPU_CHECK_CAPS="bench=30 build=200" overrides);
#   a step gets at most what is left of the budget; a failing, timed-out or skipped step is reported and
#   the others still run.
# Writes to OUTDIR (earlier runs' files there are deleted first): report.json (complete, passed, every
# step's status passed/failed/skipped/timed out, rc, seconds, cap and its numbers; written by an exit trap,
# so a killed run leaves one too, with complete false), summary.txt (what it printed), env.txt, and one
# <step>.log per step plus the steps' own JSON files.
# Exit status: 0 when every step that ran passed; 1 otherwise; 2 when there is no GPU; 3 when the preflight
# found something missing; 128+N when stopped by signal N.
set -uo pipefail

OUTDIR=${1:?usage: scripts/gpu_check.sh OUTDIR}
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
cd "$(dirname "$0")/.." || exit 2
REPO=$PWD
export PYTHONUNBUFFERED=1 PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
BUDGET_S=${GPU_CHECK_BUDGET_S:-570}
KILL_AFTER_S=${GPU_CHECK_KILL_AFTER_S:-10}
# A fresh report per run: nothing an earlier run left in OUTDIR is read or merged.
rm -rf "$OUTDIR"/report.json "$OUTDIR"/steps.tsv "$OUTDIR"/summary.txt "$OUTDIR"/env.txt "$OUTDIR"/*.log \
  "$OUTDIR"/*.xml "$OUTDIR"/preflight.json "$OUTDIR"/selfcheck.json "$OUTDIR"/bench_syncbn_cuda.json \
  "$OUTDIR"/occupancy.json "$OUTDIR"/train_compare
: > "$OUTDIR/summary.txt"
: > "$OUTDIR/steps.tsv"
T0=$(date +%s)  # restarted once setup is done: the budget is for the checks
elapsed() { echo $(( $(date +%s) - T0 )); }
log() { echo "[gpu_check +$(elapsed)s] $*" | tee -a "$OUTDIR/summary.txt"; }

# --- Python with a CUDA torch -------------------------------------------------------------------------
# scripts/gpu_check_probe.py prints key=value lines: kind (gpu: CUDA torch, GPU visible; nogpu: CUDA torch,
# no GPU; cpu: CPU-only torch; none: no torch), torch, cuda, gpus, name, cap, include (Python.h's folder).
declare -A P
probe() {
  P=()
  local k v
  while IFS='=' read -r k v; do [ -n "$k" ] && P[$k]=$v; done < <("$1" "$REPO/scripts/gpu_check_probe.py" 2>/dev/null)
}
# The PyTorch wheel index for this machine's CUDA: the toolkit's nvcc if there is one, else the newest CUDA
# the driver supports (nvidia-smi's "CUDA Version").
torch_index() {
  if [ -n "${GPU_CHECK_TORCH_INDEX:-}" ]; then echo "$GPU_CHECK_TORCH_INDEX"; return; fi
  local v
  v=$({ "${CUDA_HOME:-/nonexistent}/bin/nvcc" --version || nvcc --version; } 2>/dev/null | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p' | head -1)
  [ -n "$v" ] || v=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\.[0-9]*\).*/\1/p' | head -1)
  case "$v" in
    1[3-9].*) echo https://download.pytorch.org/whl/cu130 ;;
    12.[89]*) echo https://download.pytorch.org/whl/cu128 ;;
    12.*) echo https://download.pytorch.org/whl/cu126 ;;
    *) echo https://download.pytorch.org/whl/cu130 ;;
  esac
}
PY=""
for cand in "${PYTHON:-}" ./.venv/bin/python "$(command -v python3 || true)"; do
  [ -n "$cand" ] && [ -x "$cand" ] || continue
  probe "$cand"
  if [ "${P[kind]:-}" = gpu ]; then PY=$cand; break; fi
  if [ "${P[kind]:-}" = nogpu ]; then
    smi=$(nvidia-smi -L 2>&1 | head -3 || true)
    log "STOP: no CUDA GPU visible: torch.cuda.is_available() is False in $cand (torch ${P[torch]:-?}, CUDA ${P[cuda]:-?}); nvidia-smi: ${smi:-not found}. Run make gpu-check on a machine with an NVIDIA GPU and its driver (CUDA_VISIBLE_DEVICES must not hide it); nothing was checked."
    exit 2
  fi
done
if [ -z "$PY" ]; then
  index=$(torch_index)
  pins=$(grep -E '^(torch|torchvision)==' requirements.txt | tr '\n' ' ')
  log "no Python with a CUDA torch found; creating .venv: $pins from $index, then requirements.txt (needs network)"
  # shellcheck disable=SC2086  # $pins is a list of requirement specifiers
  python3 -m venv .venv && .venv/bin/python -m pip install -q $pins --index-url "$index" >>"$OUTDIR/env.txt" 2>&1 \
    && .venv/bin/python -m pip install -q -r requirements.txt >>"$OUTDIR/env.txt" 2>&1 \
    && probe .venv/bin/python && [ "${P[kind]:-}" = gpu ] && PY=.venv/bin/python
  if [ -z "$PY" ]; then log "STOP: no usable Python with a CUDA torch and a GPU (see env.txt); nothing was checked."; exit 2; fi
fi
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu_check_site \
    .whl/*.whl >>"$OUTDIR/env.txt" 2>&1 && export PYTHONPATH="$PYTHONPATH:/tmp/gpu_check_site"
fi
# The chosen environment's own tools (ninja, pytest's console scripts) first: it is not activated here.
PATH="$(dirname "$PY"):$PATH"
export PATH

# --- Report on any exit ---------------------------------------------------------------------------------
STEPS=(preflight build selfcheck occupancy bench kernel_tests sanitizer_memcheck sanitizer_initcheck
       sanitizer_racecheck sanitizer_synccheck train_compare slow_tests)
PLANNED=$(IFS=,; echo "${STEPS[*]}")
COMPLETE=0
FAILED=0
CURRENT=""        # the step running now, its start and the pid of its `timeout` (its own process group)
CURRENT_T0=0
CURRENT_PID=""
CURRENT_CAP=0
# shellcheck disable=SC2329  # invoked by the EXIT trap
finish() {
  local rc=$?
  trap - EXIT INT TERM HUP
  if [ -n "$CURRENT_PID" ]; then  # stopped during a step: end it (and its children), record it as cut short
    kill -TERM -- "-$CURRENT_PID" 2>/dev/null || kill -TERM "$CURRENT_PID" 2>/dev/null
    for _ in 1 2 3 4 5; do kill -0 "$CURRENT_PID" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$CURRENT_PID" 2>/dev/null
    printf '%s\ttimed out\t%s\t%s\t%s\tthe run was stopped (signal) during this step; its output so far: %s.log\n' \
      "$CURRENT" "$rc" "$(( $(date +%s) - CURRENT_T0 ))" "$CURRENT_CAP" "$CURRENT" >>"$OUTDIR/steps.tsv"
    log "$CURRENT: STOPPED by a signal after $(( $(date +%s) - CURRENT_T0 ))s"
  fi
  "$PY" "$REPO/scripts/gpu_check_report.py" "$OUTDIR" "$(elapsed)" "$BUDGET_S" "$COMPLETE" "$PLANNED" \
    | tee -a "$OUTDIR/summary.txt"
  if [ "$rc" -eq 0 ] && [ "$FAILED" -ne 0 ]; then rc=1; fi
  exit "$rc"
}
trap finish EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
trap 'exit 129' HUP

# --- Step runner ---------------------------------------------------------------------------------------
# Caps in seconds, in run order; GPU_CHECK_CAPS="name=seconds ..." overrides some.
declare -A CAP=([build]=300 [selfcheck]=60 [occupancy]=30 [bench]=60 [kernel_tests]=150 [sanitizer_memcheck]=60
                [sanitizer_initcheck]=60 [sanitizer_racecheck]=60 [sanitizer_synccheck]=60 [train_compare]=150
                [slow_tests]=240)
for kv in ${GPU_CHECK_CAPS:-}; do CAP[${kv%%=*}]=${kv#*=}; done
# row NAME STATUS RC SECONDS CAP NOTE: one line of steps.tsv (gpu_check_report.py reads it).
row() { printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$OUTDIR/steps.tsv"; }
skip() {  # skip NAME REASON
  row "$1" skipped - 0 0 "$2"
  log "$1: SKIPPED ($2)"
}
# step NAME CMD...: runs CMD with the smaller of the step's cap and what is left of the budget, under
# `timeout -k` (TERM at the limit, KILL KILL_AFTER_S later), output in NAME.log, GPU_CHECK_STEP=NAME in its
# environment. Runs in the background and waits, so that a signal to the script ends it at once.
step() {
  local name=$1; shift
  local want=${CAP[$name]} left=$(( BUDGET_S - $(elapsed) - 5 ))
  if [ "$left" -lt 10 ]; then skip "$name" "no time left in the ${BUDGET_S}s budget"; return 0; fi
  local limit=$(( want < left ? want : left )) rc status
  CURRENT=$name CURRENT_T0=$(date +%s) CURRENT_CAP=$limit
  GPU_CHECK_STEP=$name timeout -k "$KILL_AFTER_S" "$limit" "$@" >"$OUTDIR/$name.log" 2>&1 </dev/null &
  CURRENT_PID=$!
  wait "$CURRENT_PID"
  rc=$?
  local took=$(( $(date +%s) - CURRENT_T0 ))
  CURRENT="" CURRENT_PID=""
  case $rc in
    0) status=passed ;;
    124|137) status="timed out" ;;  # TERM at the cap (124), or KILL after it (137)
    *) status=failed ;;
  esac
  [ "$status" = passed ] || FAILED=1
  row "$name" "$status" "$rc" "$took" "$limit" ""
  log "$name: ${status^^} (rc=$rc, ${took}s, cap ${limit}s; $OUTDIR/$name.log)"
  tail -n 4 "$OUTDIR/$name.log" | sed 's/^/    /' | tee -a "$OUTDIR/summary.txt"
  return 0
}

# --- Preflight: everything the build and the checks need, named at once -------------------------------
SETUP_T0=$(date +%s)
MISSING=()
if ! command -v nvidia-smi >/dev/null; then
  MISSING+=("nvidia-smi not found: the NVIDIA driver's utilities are not installed or not on PATH")
elif ! smi=$(nvidia-smi -L 2>&1) || ! grep -q '^GPU ' <<<"$smi"; then
  MISSING+=("nvidia-smi lists no GPU (is the driver loaded?): $(head -2 <<<"$smi" | tr '\n' ' ')")
fi
[ "${P[gpus]:-0}" -ge 1 ] 2>/dev/null || MISSING+=("torch sees no GPU in $PY")
TORCH_CUDA=${P[cuda]:-}
nvcc_release() { "$1" --version 2>/dev/null | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p' | head -1; }
# The toolkit: CUDA_HOME if set (and only it, as src/syncbn/toolkit.py does), else the first of nvcc's own
# root, /usr/local/cuda-<torch's CUDA>, /usr/local/cuda whose nvcc has torch's CUDA major version.
if [ -n "${CUDA_HOME:-}" ]; then roots=("$CUDA_HOME"); else
  roots=("$(dirname "$(dirname "$(readlink -f "$(command -v nvcc || echo /nonexistent/bin/nvcc)")")")"
         "/usr/local/cuda-$TORCH_CUDA" /usr/local/cuda)
fi
found=()
TOOLKIT=""
for d in "${roots[@]}"; do
  [ -x "$d/bin/nvcc" ] && [ -f "$d/include/cuda_runtime.h" ] || continue
  rel=$(nvcc_release "$d/bin/nvcc")
  found+=("$d (nvcc ${rel:-?})")
  if [ -n "$rel" ] && [ "${rel%%.*}" = "${TORCH_CUDA%%.*}" ]; then TOOLKIT=$d; break; fi
done
if [ -n "$TOOLKIT" ]; then export CUDA_HOME=$TOOLKIT; else
  MISSING+=("no CUDA toolkit whose nvcc has torch's CUDA major version (torch.version.cuda = ${TORCH_CUDA:-?}); looked in ${roots[*]}; found: ${found[*]:-none}. Install CUDA ${TORCH_CUDA:-?}'s toolkit and set CUDA_HOME to it")
fi
[ -f "${P[include]:-/nonexistent}/Python.h" ] || MISSING+=("Python.h not found in ${P[include]:-?}: install the Python headers (Debian/Ubuntu: apt-get install python3-dev)")
CXX_BIN=${CXX:-c++}
command -v "$CXX_BIN" >/dev/null || MISSING+=("C++ compiler '$CXX_BIN' not found: install g++ (Debian/Ubuntu: apt-get install g++) or set CXX")
command -v ninja >/dev/null || MISSING+=("ninja not found beside $PY nor on PATH: pip install ninja (requirements.txt has it)")
{
  echo "python: $PY"
  for k in "${!P[@]}"; do echo "probe $k=${P[$k]}"; done
  echo "CUDA_HOME=${CUDA_HOME:-unset} (found: ${found[*]:-none})"
  nvidia-smi 2>&1 | head -20
} >>"$OUTDIR/env.txt" 2>&1
if [ "${#MISSING[@]}" -gt 0 ]; then
  for m in "${MISSING[@]}"; do log "PREFLIGHT: missing: $m"; done
  row preflight failed 3 $(( $(date +%s) - SETUP_T0 )) 0 "$(IFS=';'; echo "${MISSING[*]}")"
  log "STOP: the preflight found ${#MISSING[@]} missing piece(s) (above); nothing was built."
  exit 3
fi
row preflight passed 0 $(( $(date +%s) - SETUP_T0 )) 0 ""
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-${P[cap]}}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
export SYNCTRAIN_EXTENSIONS_DIR=${SYNCTRAIN_EXTENSIONS_DIR:-$PWD/build/torch_extensions}
SANITIZER=""
for s in "$CUDA_HOME/bin/compute-sanitizer" "$(command -v compute-sanitizer || true)"; do
  if [ -n "$s" ] && [ -x "$s" ]; then SANITIZER=$s; break; fi
done
T0=$(date +%s)
log "python: $PY (torch ${P[torch]}, CUDA ${P[cuda]}, ${P[name]:-?} x ${P[gpus]:-?}, sm ${P[cap]:-?}); CUDA_HOME=$CUDA_HOME; the ${BUDGET_S}s budget starts now"

# --- The steps, cheapest and most telling first ---------------------------------------------------------
TIMEOUT_OPT=()
if [ "${P[pytest_timeout]:-0}" = 1 ]; then TIMEOUT_OPT=(--timeout); fi
pytest_step() {  # pytest_step NAME PER_TEST_S FILES...: the `cuda` tests of exactly these files
  local name=$1 per_test=$2; shift 2
  local opt=()
  if [ "${#TIMEOUT_OPT[@]}" -gt 0 ]; then opt=(--timeout "$per_test"); fi
  step "$name" "$PY" -m pytest -o addopts= -m cuda -v -rfE -p no:cacheprovider --continue-on-collection-errors \
    "${opt[@]}" --junitxml="$OUTDIR/$name.xml" "$@"
  grep -E '(^(FAILED|ERROR) | (FAILED|ERROR)( |$))' "$OUTDIR/$name.log" | head -30 | tee -a "$OUTDIR/summary.txt"
}
# 1. Build exactly the variant training uses here (CUDA + CPU ops in one library); without a usable nvcc the
#    loader would build the CPU-only variant: the step fails then, with the loader's reason.
step build "$PY" -c 'from src.syncbn import extension as e; m = e.load_extension(); print(m.__file__, e.last_build_info()); p = e.cuda_kernels_problem(); assert p is None, p'
if ! grep -q "^build"$'\t'"passed" "$OUTDIR/steps.tsv"; then
  tail -40 "$OUTDIR/build.log"
  for s in "${STEPS[@]:2}"; do skip "$s" "the build failed"; done
else
  # 2. The self-check a training process runs (all cases and dtypes), timed cold and warm.
  step selfcheck "$PY" -m src.syncbn.selfcheck --json "$OUTDIR/selfcheck.json"
  # 3. Resident blocks per SM of every kernel (cudaOccupancyMaxActiveBlocksPerMultiprocessor).
  step occupancy "$PY" scripts/gpu_occupancy.py "$OUTDIR/occupancy.json"
  # 4. Our kernels against PyTorch's on two small shapes (its own correctness columns are in the JSON).
  step bench "$PY" scripts/bench_syncbn_cuda.py --quick --json "$OUTDIR/bench_syncbn_cuda.json"
  # 5. The single-process kernel tests marked cuda: an explicit list (a missing optional package elsewhere
  #    cannot stop collection), pytest.ini's addopts dropped, a per-test timeout.
  kernel_tests=(tests/syncbn/test_cuda_kernels.py tests/syncbn/test_cuda_large_index.py
    tests/syncbn/test_cuda_kernel_fixes.py tests/syncbn/test_kernel_errors.py tests/syncbn/test_selfcheck.py
    tests/syncbn/test_module_single.py tests/syncbn/test_gradcheck.py tests/syncbn/test_errors.py
    tests/models/test_cuda.py)
  pytest_step kernel_tests 60 "${kernel_tests[@]}"
  # 6. compute-sanitizer on our kernels only (kernel names contain "syncbn"), one pass over every self-check
  #    case; the caching allocator off, so out-of-bounds accesses inside pooled segments and reads of
  #    reused memory are seen.
  for tool in memcheck initcheck racecheck synccheck; do
    if [ -z "$SANITIZER" ]; then skip "sanitizer_$tool" "compute-sanitizer not found (CUDA_HOME=$CUDA_HOME)"; continue; fi
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 step "sanitizer_$tool" "$SANITIZER" --tool "$tool" --kernel-name kns=syncbn \
      --error-exitcode 7 "$PY" -m src.syncbn.selfcheck --quick
  done
  # 7. A few float64 training steps, norm=syncbn vs norm=torch_syncbn over NCCL (2 processes on 2+ GPUs; one
  #    process on one GPU: reported partial).
  step train_compare "$PY" scripts/gpu_train_compare.py "$OUTDIR/train_compare" --steps 6 --timeout 60
  # 8. The slower cuda tests: multi-process (gloo/NCCL) and torch.compile.
  pytest_step slow_tests 120 tests/syncbn/test_collective_protocol.py tests/syncbn/test_distributed_equivalence.py \
    tests/syncbn/test_ddp_training.py tests/syncbn/test_compile.py
fi
COMPLETE=1
exit "$FAILED"
