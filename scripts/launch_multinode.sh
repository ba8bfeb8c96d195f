#!/usr/bin/env bash
# Multi-node training with torchrun's c10d rendezvous. Run the SAME command on every node; the nodes
# find each other through the rendezvous endpoint and torchrun assigns the ranks.
#
#   scripts/launch_multinode.sh [HYDRA OVERRIDES...]
#
#   # on each of 2 nodes (node0 reachable as node0.cluster:29400 from both):
#   NNODES=2 RDZV_ENDPOINT=node0.cluster:29400 RDZV_ID=resnet50-run1 \
#     scripts/launch_multinode.sh model=resnet50 data=imagefolder data.root=/shared/imagenet \
#       hydra.run.dir=/shared/runs/resnet50-run1 trainer.resume=auto trainer.checkpoint_every=500
#
# Environment (default in brackets):
#   NNODES          number of nodes, or MIN:MAX for an elastic job                          [1]
#   NPROC_PER_NODE  workers per node: an integer, or gpu / cpu / auto (torchrun's meanings)
#                   [gpu when nvidia-smi lists a GPU, else 1]
#   RDZV_ENDPOINT   HOST:PORT of the rendezvous. Any node's address that every node can reach;
#                   the node whose hostname/IP matches HOST serves it on PORT.        [127.0.0.1:29400]
#   RDZV_ID         job id, identical on all nodes and unique per job (a second job using the same
#                   endpoint and id would join this one)                 [$SLURM_JOB_ID, else synctrain]
#   RDZV_CONF       extra rendezvous settings, e.g. join_timeout=900 (seconds the first node waits
#                   for the others; torchrun's default is 600)                                   [unset]
#   MAX_RESTARTS    how many times torchrun restarts the whole worker group after a worker fails;
#                   each restart resumes from the last checkpoint when trainer.resume=auto        [3]
#   MONITOR_INTERVAL  seconds between torchrun's checks of its workers                         [unset]
#   SHUTDOWN_TIMEOUT  seconds torchrun waits for its workers to exit after a stop signal (they
#                   finish the optimizer step and save last.pt first) before SIGKILL        [torchrun: 30]
#   LOG_DIR         torchrun --log-dir: per-worker stdout/stderr files                          [unset]
#   TRAIN_SCRIPT    the entry point                                       [train.py of this checkout]
#   TORCHRUN        the torchrun executable                                               [torchrun]
#   DRY_RUN=1       print the torchrun command instead of running it
#
# Fault tolerance needs a fixed run directory on storage every node sees: after a restart the
# workers are started again with the same arguments, and Hydra's default run dir contains the start
# time, so without hydra.run.dir=PATH the restarted job would not find its checkpoints.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

nnodes="${NNODES:-1}"
if [[ -z "${NPROC_PER_NODE:-}" ]]; then
    if command -v nvidia-smi > /dev/null 2>&1 && nvidia-smi -L 2> /dev/null | grep -q '^GPU'; then
        NPROC_PER_NODE=gpu
    else
        NPROC_PER_NODE=1
    fi
fi
rdzv_endpoint="${RDZV_ENDPOINT:-127.0.0.1:29400}"
rdzv_id="${RDZV_ID:-${SLURM_JOB_ID:-synctrain}}"
max_restarts="${MAX_RESTARTS:-3}"
train_script="${TRAIN_SCRIPT:-${repo_root}/train.py}"
torchrun_bin="${TORCHRUN:-torchrun}"

endpoint_pattern='^(\[[0-9a-fA-F:]+\]|[^:]+):[0-9]+$'   # host:port or [ipv6]:port
if [[ ! "${rdzv_endpoint}" =~ ${endpoint_pattern} ]]; then
    echo "launch_multinode.sh: RDZV_ENDPOINT must be HOST:PORT (e.g. node0:29400), got '${rdzv_endpoint}'" >&2
    exit 2
fi
if [[ ! "${max_restarts}" =~ ^[0-9]+$ ]]; then
    echo "launch_multinode.sh: MAX_RESTARTS must be a non-negative integer, got '${max_restarts}'" >&2
    exit 2
fi
if [[ ! -f "${train_script}" ]]; then
    echo "launch_multinode.sh: TRAIN_SCRIPT '${train_script}' does not exist" >&2
    exit 2
fi

has_run_dir=0
for arg in "$@"; do
    if [[ "${arg}" == hydra.run.dir=* ]]; then
        has_run_dir=1
    fi
done
if [[ "${max_restarts}" != 0 && "${has_run_dir}" == 0 ]]; then
    echo "launch_multinode.sh: warning: MAX_RESTARTS=${max_restarts} but no hydra.run.dir=PATH override;" \
        "a restarted job starts a new run directory and cannot resume from its checkpoints" >&2
fi

# torchrun's default signal list plus SIGUSR1 (SLURM's usual early-warning signal): torchrun then passes
# it on to its workers, which stop after the current step and save, instead of dying from it.
handled_signals="SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
cmd=("${torchrun_bin}"
    --nnodes="${nnodes}"
    --nproc_per_node="${NPROC_PER_NODE}"
    --rdzv_backend=c10d
    --rdzv_endpoint="${rdzv_endpoint}"
    --rdzv_id="${rdzv_id}"
    --max-restarts="${max_restarts}"
    --signals-to-handle="${handled_signals}")
if [[ -n "${SHUTDOWN_TIMEOUT:-}" ]]; then
    cmd+=(--shutdown-timeout="${SHUTDOWN_TIMEOUT}")
fi
if [[ -n "${RDZV_CONF:-}" ]]; then
    cmd+=(--rdzv_conf="${RDZV_CONF}")
fi
if [[ -n "${MONITOR_INTERVAL:-}" ]]; then
    cmd+=(--monitor-interval="${MONITOR_INTERVAL}")
fi
if [[ -n "${LOG_DIR:-}" ]]; then
    cmd+=(--log-dir="${LOG_DIR}")
fi
cmd+=("${train_script}" "$@")

if [[ "${DRY_RUN:-0}" == 1 ]]; then
    printf '%q ' "${cmd[@]}"
    printf '\n'
    exit 0
fi
exec "${cmd[@]}"
