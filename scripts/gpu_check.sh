#!/usr/bin/env bash
# GPU validation in one command (`make gpu-check OUT=DIR`, docs/gpu.md). First the steps that decide the verdict:
# build the SyncBN extension for this GPU, self-check the kernels, the kernel tests marked `cuda`, a float64
# training compare of norm=syncbn against norm=torch_syncbn. Then, each only if its whole cap still fits: the
# kernels' occupancy, compute-sanitizer on the self-check, the host-side cost of the exchange, the benchmarks,
# two more sanitizer tools and the slower tests.
#
#   bash scripts/gpu_check.sh OUTDIR
#
# Made for an offline GPU node with a time limit on one command and on the files that come back:
# - Python: $PYTHON if set, else ./.venv/bin/python, else the system python3: the first with a CUDA build of
#   torch (the node's own torch is used; 2.11 to 2.14 are supported). No CUDA torch at all: it creates .venv
#   with the pinned torch from the PyTorch index of this machine's CUDA (needs network).
# - Wheels carried in ./.whl (GPU_CHECK_WHEELS overrides; `make gpu-bundle`: what the gpu-check path imports
#   that the node lacks) are installed offline into a scratch folder appended to PYTHONPATH; every step
#   inherits it. A module the path imports that is still missing stops the preflight (a forgotten .whl).
# - One budget (GPU_CHECK_BUDGET_S, default 420 s) from the start: setup, build and steps. Each step runs
#   under its cap (GPU_CHECK_CAPS="bench=30 build=200"; 0 skips the step) and never past what is left of the
#   budget (`timeout -k`: TERM, KILL GPU_CHECK_KILL_AFTER_S later); a step with too little time left is
#   skipped, and so is one of the steps run if time is left whose whole cap no longer fits (cutting it
#   short would only report it timed out). A watchdog stops the whole run at the budget however it got there
#   (a hang in the setup, say). The verdict steps' caps fit the budget together with the setup: a run whose
#   steps each stay under their caps never has one cut short. A failed, timed-out or skipped step is
#   reported and the rest still run.
# Writes to OUTDIR, after every step and at the end (an exit trap: also on a signal or without a GPU):
# report.json (complete, passed, reason, every step's status passed/failed/skipped/timed out, rc, seconds,
# cap and its own JSON results), summary.txt (what it printed) and logs.tar.gz (every step's log, the
# pytest XML, the steps' JSON and env.txt): three files, whatever happens. Earlier runs' files there are
# deleted first. Exit status: 0 when every step that ran passed; 1 otherwise; 2 without a GPU; 3 when the
# preflight found something missing; 128+N when stopped by signal N (the watchdog's stop: 143).
set -uo pipefail

OUTDIR=${1:?usage: scripts/gpu_check.sh OUTDIR}
mkdir -p "$OUTDIR" || exit 2
OUTDIR=$(cd "$OUTDIR" && pwd)
cd "$(dirname "$0")/.." || exit 2
REPO=$PWD
T0=$(date +%s)
BUDGET_S=${GPU_CHECK_BUDGET_S:-420}
KILL_AFTER_S=${GPU_CHECK_KILL_AFTER_S:-10}
FINISH_S=5  # kept back at the end for the report and the archive
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX") || exit 2
SITE=$WORK/site  # the carried wheels are installed here
export PYTHONUNBUFFERED=1 PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
# A fresh report per run: nothing an earlier run left in OUTDIR is read or merged.
rm -rf "$OUTDIR/report.json" "$OUTDIR/summary.txt" "$OUTDIR/logs.tar.gz"
: > "$OUTDIR/summary.txt"
: > "$WORK/steps.tsv"
elapsed() { echo $(( $(date +%s) - T0 )); }
log() { echo "[gpu_check +$(elapsed)s] $*" | tee -a "$OUTDIR/summary.txt"; }

VERDICT=(build selfcheck kernel_tests train_compare)  # then the optional ones, each with its whole cap or not at all
STEPS=(preflight "${VERDICT[@]}" occupancy sanitizer_memcheck sanitizer_racecheck exchange_host bench bench_loader
       sanitizer_initcheck sanitizer_synccheck slow_tests)
SETUP_S=30  # what the verdict steps' caps leave for the set-up (probe, wheels, preflight) and the reports between steps
PLANNED=$(IFS=,; echo "${STEPS[*]}")
COMPLETE=0
FAILED=0
REASON=""         # why the run stopped early (report.json's `reason`)
PY=""
CURRENT=""        # the step running now, its start and the pid of its `timeout` (its own process group)
CURRENT_T0=0
CURRENT_PID=""
CURRENT_CAP=0
WATCHDOG=""
TAIL=0            # 1 for the steps run only if time is left: each runs with its whole cap or not at all

# --- The report: after every step and from the exit trap -------------------------------------------------
write_report() {  # write_report COMPLETE: report.json and logs.tar.gz in OUTDIR from what WORK holds now
  local py=${PY:-$(command -v python3 || true)}
  if [ -n "$py" ] && "$py" "$REPO/scripts/gpu_check_report.py" "$WORK" "$OUTDIR" "$(elapsed)" "$BUDGET_S" "$1" \
       "$PLANNED" "$REASON" "$CURRENT" >"$WORK/report.out" 2>&1; then :; else
    # No Python to write it with: the few fields the shell knows.
    printf '{"complete": false, "passed": false, "reason": "%s", "seconds": %s, "budget_s": %s, "steps": []}\n' \
      "${REASON//\"/\'}" "$(elapsed)" "$BUDGET_S" >"$OUTDIR/report.json"
  fi
  # Model checkpoints stay out: the archive holds what a person reads.
  tar -czf "$OUTDIR/logs.tar.gz.tmp" -C "$WORK" --exclude='*.pt' --exclude=site . 2>/dev/null \
    && mv "$OUTDIR/logs.tar.gz.tmp" "$OUTDIR/logs.tar.gz"
}

# shellcheck disable=SC2329  # invoked by the EXIT trap
finish() {
  local rc=$?
  trap - EXIT INT TERM HUP
  [ "$COMPLETE" = 1 ] || [ -n "$REASON" ] || REASON="stopped early (exit status $rc)"
  [ -n "$WATCHDOG" ] && kill "$WATCHDOG" 2>/dev/null
  [ -n "$PROBE_PID" ] && kill "$PROBE_PID" 2>/dev/null
  if [ -n "$CURRENT_PID" ]; then  # stopped during a step: end it (and its children), record it as cut short
    kill -TERM -- "-$CURRENT_PID" 2>/dev/null || kill -TERM "$CURRENT_PID" 2>/dev/null
    for _ in 1 2 3 4 5; do kill -0 "$CURRENT_PID" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$CURRENT_PID" 2>/dev/null
    printf '%s\ttimed out\t%s\t%s\t%s\tthe run was stopped during this step (%s); its output so far: %s.log in logs.tar.gz\n' \
      "$CURRENT" "$rc" "$(( $(date +%s) - CURRENT_T0 ))" "$CURRENT_CAP" "$REASON" "$CURRENT" >>"$WORK/steps.tsv"
    log "$CURRENT: STOPPED after $(( $(date +%s) - CURRENT_T0 ))s ($REASON)"
    CURRENT=""
  fi
  write_report "$COMPLETE"
  cat "$WORK/report.out" 2>/dev/null | tee -a "$OUTDIR/summary.txt"
  rm -rf "$WORK"
  if [ "$rc" -eq 0 ] && [ "$FAILED" -ne 0 ]; then rc=1; fi
  exit "$rc"
}
# shellcheck disable=SC2329  # invoked by the TERM trap
on_term() {
  if [ -f "$WORK/budget_spent" ]; then REASON="the ${BUDGET_S}s budget was spent (hard stop)"; fi
  REASON=${REASON:-stopped by SIGTERM}
  exit 143
}
trap finish EXIT
trap on_term TERM
trap 'REASON=${REASON:-stopped by SIGINT}; exit 130' INT
trap 'REASON=${REASON:-stopped by SIGHUP}; exit 129' HUP
# The hard stop: whatever runs at the budget's end (a step, the setup) is ended and the report written.
# It ends with the script (if the script is killed outright, no TERM goes to a pid another process reuses).
SELF=$$
( me=$BASHPID
  while [ $(( $(date +%s) - T0 )) -lt "$BUDGET_S" ]; do
    sleep 1
    parent=$(awk '{ print $4 }' "/proc/$me/stat" 2>/dev/null)  # empty without /proc: no such check
    [ -z "$parent" ] || [ "$parent" = "$SELF" ] || exit 0
  done
  : >"$WORK/budget_spent"; kill -TERM "$SELF" ) 2>/dev/null &
WATCHDOG=$!

stop() {  # stop STATUS REASON: end the run early (the trap writes the report)
  REASON=$2
  log "STOP: $2"
  exit "$1"
}

# --- Python with a CUDA torch -------------------------------------------------------------------------
# scripts/gpu_check_probe.py prints key=value lines: kind (gpu: CUDA torch, GPU visible; nogpu: CUDA torch,
# no GPU; cpu: CPU-only torch; none: no torch), torch, cuda, gpus, name, cap, include (Python.h's folder).
# In the background, so that the hard stop ends a probe that hangs (in the driver, say) at once.
declare -A P
PROBE_PID=""
probe() {
  P=()
  local k v
  "$1" "$REPO/scripts/gpu_check_probe.py" >"$WORK/probe.out" 2>/dev/null </dev/null &
  PROBE_PID=$!
  wait "$PROBE_PID"
  PROBE_PID=""
  while IFS='=' read -r k v; do [ -n "$k" ] && P[$k]=$v; done <"$WORK/probe.out"
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
for cand in "${PYTHON:-}" ./.venv/bin/python "$(command -v python3 || true)"; do
  [ -n "$cand" ] && [ -x "$cand" ] || continue
  probe "$cand"
  if [ "${P[kind]:-}" = gpu ]; then PY=$cand; break; fi
  if [ "${P[kind]:-}" = nogpu ]; then
    PY=$cand  # writes the report
    if command -v nvidia-smi >/dev/null; then smi=$(nvidia-smi -L 2>&1 | head -3 | tr '\n' ' '); else smi="not installed"; fi
    stop 2 "no CUDA GPU visible: torch.cuda.is_available() is False in $cand (torch ${P[torch]:-?}, CUDA ${P[cuda]:-?}); nvidia-smi: ${smi:-not found}. Run make gpu-check on a machine with an NVIDIA GPU and its driver (CUDA_VISIBLE_DEVICES must not hide it); nothing was checked."
  fi
done
if [ -z "$PY" ]; then
  index=$(torch_index)
  pins=$(grep -E '^(torch|torchvision)==' requirements.txt | tr '\n' ' ')
  log "no Python with a CUDA torch found; creating .venv: $pins from $index, then requirements.txt (needs network)"
  # shellcheck disable=SC2086  # $pins is a list of requirement specifiers
  python3 -m venv .venv && .venv/bin/python -m pip install -q $pins --index-url "$index" >>"$WORK/env.txt" 2>&1 \
    && .venv/bin/python -m pip install -q -r requirements.txt >>"$WORK/env.txt" 2>&1 \
    && probe .venv/bin/python && [ "${P[kind]:-}" = gpu ] && PY=.venv/bin/python
  [ -n "$PY" ] || stop 2 "no usable Python with a CUDA torch and a GPU (the attempt to make one is in env.txt, logs.tar.gz); nothing was checked."
fi
WHEELS=${GPU_CHECK_WHEELS:-.whl}
CARRIED="No wheels in $WHEELS: run make gpu-bundle on a machine with network and carry .whl with the checkout (docs/gpu.md)"
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
       "$WHEELS"/*.whl >>"$WORK/env.txt" 2>&1; then
    export PYTHONPATH="$PYTHONPATH:$SITE"
    log "carried wheels installed for this run (PYTHONPATH += $SITE): $(cd "$WHEELS" && printf '%s ' ./*.whl)"
    CARRIED="The wheels of $WHEELS lack them: make the bundle for this node's packages (make gpu-bundle NODE_PACKAGES=its pip list --format=freeze) and carry .whl again"
  else
    log "the carried wheels in $WHEELS could not be installed (env.txt in logs.tar.gz)"
    CARRIED="The wheels of $WHEELS could not be installed with $PY -m pip (env.txt in logs.tar.gz)"
  fi
fi
# The chosen environment's own tools (ninja, pytest's console scripts) first: it is not activated here.
PATH="$(dirname "$PY"):$PATH"
export PATH

# --- Step runner ---------------------------------------------------------------------------------------
# Caps in seconds (docs/gpu.md gives what each is sized from); GPU_CHECK_CAPS="name=seconds ..." overrides.
declare -A CAP=([build]=120 [selfcheck]=45 [kernel_tests]=100 [train_compare]=100 [occupancy]=20
                [sanitizer_memcheck]=60 [sanitizer_racecheck]=60 [exchange_host]=100 [bench]=45 [bench_loader]=60
                [sanitizer_initcheck]=60 [sanitizer_synccheck]=60 [slow_tests]=150)
for kv in ${GPU_CHECK_CAPS:-}; do CAP[${kv%%=*}]=${kv#*=}; done
VERDICT_S=0
for s in "${VERDICT[@]}"; do VERDICT_S=$(( VERDICT_S + ${CAP[$s]:-0} )); done
# row NAME STATUS RC SECONDS CAP NOTE: one line of steps.tsv (gpu_check_report.py reads it).
row() { printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$WORK/steps.tsv"; }
skip() {  # skip NAME REASON (the next step's report, or the final one, carries it: no Python started here)
  row "$1" skipped - 0 0 "$2"
  log "$1: SKIPPED ($2)"
}
# step NAME CMD...: runs CMD with the smaller of the step's cap and what is left of the budget, under
# `timeout -k` (TERM at the limit, KILL KILL_AFTER_S later), output in NAME.log, GPU_CHECK_STEP=NAME in its
# environment. Runs in the background and waits, so that a signal ends it at once.
step() {
  local name=$1; shift
  local want=${CAP[$name]:-60} left=$(( BUDGET_S - $(elapsed) - KILL_AFTER_S - FINISH_S ))
  if [ "$want" -le 0 ] 2>/dev/null; then skip "$name" "cap 0 (GPU_CHECK_CAPS)"; return 0; fi
  if [ "$left" -lt 10 ]; then skip "$name" "no time left in the ${BUDGET_S}s budget"; return 0; fi
  if [ "$TAIL" = 1 ] && [ "$want" -gt "$left" ]; then
    skip "$name" "no time left for its ${want}s cap (${left}s of the ${BUDGET_S}s budget were left)"; return 0
  fi
  local limit=$(( want < left ? want : left )) rc status
  CURRENT=$name CURRENT_T0=$(date +%s) CURRENT_CAP=$limit
  write_report 0  # names the step as running: what remains if the run is killed outright during it
  GPU_CHECK_STEP=$name timeout -k "$KILL_AFTER_S" "$limit" "$@" >"$WORK/$name.log" 2>&1 </dev/null &
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
  log "$name: ${status^^} (rc=$rc, ${took}s, cap ${limit}s)"
  tail -n 4 "$WORK/$name.log" | sed 's/^/    /' | tee -a "$OUTDIR/summary.txt"
  write_report 0
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
# What the steps import that this Python cannot (hydra and omegaconf on a node without them: the carried wheels).
if ! absent=$("$PY" scripts/gpu_imports.py --unimportable 2>&1); then
  MISSING+=("modules the checks import that $PY cannot: ${absent//$'\n'/; }. $CARRIED")
fi
{
  echo "python: $PY"
  for k in "${!P[@]}"; do echo "probe $k=${P[$k]}"; done
  echo "CUDA_HOME=${CUDA_HOME:-unset} (found: ${found[*]:-none})"
  echo "PYTHONPATH=$PYTHONPATH"
  nvidia-smi 2>&1 | head -20
} >>"$WORK/env.txt" 2>&1
if [ "${#MISSING[@]}" -gt 0 ]; then
  for m in "${MISSING[@]}"; do log "PREFLIGHT: missing: $m"; done
  row preflight failed 3 $(( $(date +%s) - SETUP_T0 )) 0 "$(IFS=';'; echo "${MISSING[*]}")"
  stop 3 "the preflight found ${#MISSING[@]} missing piece(s) (above); nothing was built."
fi
row preflight passed 0 $(( $(date +%s) - SETUP_T0 )) 0 ""
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-${P[cap]}}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
export SYNCTRAIN_EXTENSIONS_DIR=${SYNCTRAIN_EXTENSIONS_DIR:-$PWD/build/torch_extensions}
SANITIZER=""
for s in "$CUDA_HOME/bin/compute-sanitizer" "$(command -v compute-sanitizer || true)"; do
  if [ -n "$s" ] && [ -x "$s" ]; then SANITIZER=$s; break; fi
done
log "python: $PY (torch ${P[torch]}, CUDA ${P[cuda]}, ${P[name]:-?} x ${P[gpus]:-?}, sm ${P[cap]:-?}); CUDA_HOME=$CUDA_HOME; $(( BUDGET_S - $(elapsed) ))s of the ${BUDGET_S}s budget left"
log "caps: $(for s in "${STEPS[@]:1}"; do printf '%s=%s ' "$s" "${CAP[$s]:-?}"; done)"
if [ $(( VERDICT_S + SETUP_S + KILL_AFTER_S + FINISH_S )) -gt "$BUDGET_S" ]; then
  log "WARNING: the verdict steps' caps (${VERDICT[*]}: ${VERDICT_S}s) with ${SETUP_S}s for the set-up and $(( KILL_AFTER_S + FINISH_S ))s of margins exceed the ${BUDGET_S}s budget: a step under its cap may be cut short"
fi

# --- The steps: the verdict first ----------------------------------------------------------------------
TIMEOUT_OPT=0
[ "${P[pytest_timeout]:-0}" = 1 ] && TIMEOUT_OPT=1
pytest_step() {  # pytest_step NAME PER_TEST_S: the `cuda` tests of NAME's files in scripts/gpu_check_tests.txt
  local name=$1 per_test=$2 files opt=()
  mapfile -t files < <(awk -v s="$name" '$1 == s && $2 != "" { print $2 }' scripts/gpu_check_tests.txt)
  [ "$TIMEOUT_OPT" = 1 ] && opt=(--timeout "$per_test")
  step "$name" "$PY" -m pytest -o addopts= -m cuda -v -rfE -p no:cacheprovider --continue-on-collection-errors \
    "${opt[@]}" --junitxml="$WORK/$name.xml" "${files[@]}"
  grep -E '(^(FAILED|ERROR) | (FAILED|ERROR)( |$))' "$WORK/$name.log" 2>/dev/null | head -30 | tee -a "$OUTDIR/summary.txt"
}
sanitizer_step() {  # sanitizer_step TOOL: compute-sanitizer on our kernels over one pass of the self-check
  if [ -z "$SANITIZER" ]; then skip "sanitizer_$1" "compute-sanitizer not found (CUDA_HOME=$CUDA_HOME)"; return; fi
  # Our kernels only (their names contain "syncbn"); PyTorch's and the driver's own API errors are theirs, not
  # reported; the caching allocator off, so out-of-bounds accesses inside pooled segments and reads of reused
  # memory are seen. The self-check builds its inputs on the CPU, in their final layout, and copies them.
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 step "sanitizer_$1" "$SANITIZER" --tool "$1" --report-api-errors no \
    --kernel-name kns=syncbn --error-exitcode 7 "$PY" -m src.syncbn.selfcheck --quick --sanitizer
}
# 1. Exactly the variant training uses here (CUDA + CPU ops in one library); without a usable nvcc the
#    loader would build the CPU-only variant: the step fails then, with the loader's reason.
step build "$PY" -c 'from src.syncbn import extension as e; m = e.load_extension(); print(m.__file__, e.last_build_info()); p = e.cuda_kernels_problem(); assert p is None, p'
if ! grep -q "^build"$'\t'"passed" "$WORK/steps.tsv"; then
  tail -40 "$WORK/build.log" 2>/dev/null
  for s in "${STEPS[@]:2}"; do row "$s" skipped - 0 0 "the build failed"; log "$s: SKIPPED (the build failed)"; done
else
  # 2. The self-check a training process runs (every case and dtype), cold and warm.
  step selfcheck "$PY" -m src.syncbn.selfcheck --json "$WORK/selfcheck.json"
  # 3. The single-process tests marked cuda: an explicit list (a missing optional package elsewhere cannot
  #    stop collection), pytest.ini's addopts dropped, a per-test timeout.
  pytest_step kernel_tests 60
  # 4. A few float64 training steps, norm=syncbn vs norm=torch_syncbn over NCCL (2 processes on 2+ GPUs; one
  #    process on one GPU: reported partial).
  step train_compare "$PY" scripts/gpu_train_compare.py "$WORK/train_compare" --steps 6 --timeout 45
  # 5. If time is left, each with its whole cap or not at all: resident blocks per SM of every kernel
  #    (cudaOccupancyMaxActiveBlocksPerMultiprocessor, registers), compute-sanitizer's memcheck and racecheck
  #    on our kernels, the host-side cost per training step of BatchNorm, the gather exchange and the SyncBN
  #    exchange (rank 0 of a fake 8-rank group: ResNet-50, bf16, channels_last, 32 images per rank, medians
  #    over 5 rounds), the kernel benchmark, the loader with and without decoding on the GPU, the other two
  #    sanitizer tools, the slower multi-process and compile tests.
  TAIL=1
  step occupancy "$PY" scripts/gpu_occupancy.py "$WORK/occupancy.json"
  sanitizer_step memcheck
  sanitizer_step racecheck
  if [ -f scripts/bench_exchange_host.py ]; then
    step exchange_host "$PY" scripts/bench_exchange_host.py --device cuda --world-size 8 --model resnet50 \
      --dtype bfloat16 --channels-last --batch 32 --rounds 5 --json "$WORK/exchange_host.json"
  else
    skip exchange_host "script missing"
  fi
  step bench "$PY" scripts/bench_syncbn_cuda.py --quick --json "$WORK/bench_syncbn_cuda.json"
  step bench_loader "$PY" scripts/bench_loader.py --device cuda --images 512 --rounds 3 --json "$WORK/bench_loader.json"
  sanitizer_step initcheck
  sanitizer_step synccheck
  pytest_step slow_tests 120
fi
COMPLETE=1
exit "$FAILED"
