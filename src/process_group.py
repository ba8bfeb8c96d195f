"""Forming the process group: which device this process uses, the launch handshake, and teardown.

torchrun (or an srun wrapper) describes the launch in environment variables; `init_distributed` turns
them into the default process group, safely across restarts, within a timeout that names who is missing.
The collectives that run over the group are src/comm.py's; this module is only called by the command
bodies (src/commands/) and scripts, before the first collective and after the last.
"""
from __future__ import annotations

import datetime
import gc
import os
import time
import uuid
from typing import Any

import torch
import torch.distributed as torch_dist

from src.comm import get_local_rank, is_initialized
from src.errors import UserError
from src.local_gpus import check_processes_fit_gpus
from src.syncbn.groups import release_groups


def launched_distributed() -> bool:
    """True when the environment describes a multi-process launch (torchrun, srun wrapper)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def launch_world_size() -> int:
    """Processes in this job, also before init_distributed: torchrun's WORLD_SIZE (1 in a plain run)."""
    if is_initialized():
        return torch_dist.get_world_size()
    return int(os.environ["WORLD_SIZE"]) if launched_distributed() else 1


def select_device(device: str = "auto") -> torch.device:
    """The device of this process: cuda:LOCAL_RANK when GPUs are used, else the CPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UserError(f"device={device}: PyTorch sees no GPU here ({_why_no_cuda()}); use device=cpu, or "
                            "device=auto (a GPU where there is one)")
        check_processes_fit_gpus(device)  # before any process group: never two ranks on one GPU
        if device == "cuda":
            index = get_local_rank() % torch.cuda.device_count()
            device = f"cuda:{index}"
        torch.cuda.set_device(torch.device(device))
    return torch.device(device)


def _why_no_cuda() -> str:
    """Why torch.cuda.is_available() is False, as far as can be told without a GPU."""
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is built without CUDA"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1", "none", "NoDevFiles"):
        return f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU"
    return f"torch {torch.__version__} is built for CUDA {torch.version.cuda}, but finds no GPU or no driver"


class ProcessGroupInitError(RuntimeError):
    """The process group could not form within the init timeout (which rank is missing, and why)."""


def init_distributed(
    device: torch.device, backend: str = "auto", *, timeout_s: float, init_timeout_s: float
) -> None:
    """Create the default process group when launched by torchrun; nothing in a one-process run.

    `timeout_s` applies to every collective: a rank that dies or stalls makes the others fail with
    an error after that many seconds instead of hanging forever. Forming the group (reaching the
    store, meeting every rank of this launch, connecting the backend) must finish within
    `init_timeout_s`, or every rank that got that far raises ProcessGroupInitError naming the ranks
    or the store it waited for.
    """
    if is_initialized():
        return
    if not launched_distributed():
        _refuse_lone_slurm_tasks()
        return
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    init_timeout = datetime.timedelta(seconds=init_timeout_s)
    store = _launcher_store(rank, world, init_timeout, init_timeout_s)
    round_store = _join_round(store, rank, world, init_timeout_s)
    kwargs: dict[str, Any] = {}
    if device.type == "cuda":
        kwargs["device_id"] = device
    try:
        # The init timeout bounds the backend's own connection setup (gloo's full mesh, NCCL's
        # communicator); collectives get timeout_s right after.
        torch_dist.init_process_group(backend=backend, store=round_store, rank=rank, world_size=world,
                                timeout=init_timeout, **kwargs)
    except RuntimeError as err:
        raise ProcessGroupInitError(
            f"rank {rank}: the {backend} process group of {world} ranks did not connect within "
            f"trainer.dist_init_timeout_s={init_timeout_s:g} s ({err}). Another rank died or "
            "cannot be reached on the network (several interfaces: set GLOO_SOCKET_IFNAME / "
            "NCCL_SOCKET_IFNAME)."
        ) from err
    _set_collective_timeout(datetime.timedelta(seconds=timeout_s))
    store.set_timeout(datetime.timedelta(seconds=timeout_s))


def _set_collective_timeout(timeout: datetime.timedelta) -> None:
    """The default group's timeout for every later collective, on each of its backends (gloo, NCCL)."""
    set_timeout = getattr(torch_dist, "set_timeout", None)
    if set_timeout is None:  # PyTorch 2.11 has only the private form (deprecated where the public one exists)
        from torch.distributed.distributed_c10d import _set_pg_timeout as set_timeout
    set_timeout(timeout)


def _refuse_lone_slurm_tasks() -> None:
    """One of several srun tasks without torchrun's variables would train alone, each writing the same run."""
    tasks = int(os.environ.get("SLURM_STEP_NUM_TASKS", "1") or 1)
    if tasks > 1:
        raise ProcessGroupInitError(
            f"this process is one of {tasks} SLURM tasks (srun) but RANK/WORLD_SIZE are not set, so each task "
            "would train on its own: start one torchrun per node (scripts/slurm/train.sbatch), or one task "
            "per job (hydra.launcher.tasks_per_node=1 with Hydra's submitit launcher)")


# torchrun serves one key-value store per job at MASTER_ADDR:MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE)
# and hands the same store to every restarted worker group: in torch 2.14.1 nothing the workers see
# names the restart. TORCHELASTIC_RESTART_COUNT counts this agent's restarts only (an agent that is
# replaced, or a node that joins later, starts again at 0), the c10d rendezvous round is not
# exported, and the static rendezvous (--master_addr/--master_port) has no rounds at all. Process
# groups created on the bare store would read the addresses the previous workers wrote there
# ("Gloo connectFullMesh failed ... Connection refused"). So each launch's rank 0 opens a fresh
# namespace in the store, and the other ranks only use a namespace that rank 0 has admitted them to.
_ROUND_KEY = "synctrain/pg/round"


def _launcher_store(rank: int, world: int, timeout: datetime.timedelta, timeout_s: float) -> torch_dist.Store:
    """A client of torchrun's store, or (plain env launch, or a non-shared store) one rank 0 serves."""
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        if not os.environ.get(var):
            raise ProcessGroupInitError(
                f"RANK and WORLD_SIZE are set but {var} is not: launch with torchrun, or set MASTER_ADDR "
                "and MASTER_PORT to the address where rank 0 can serve the process group's store")
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    agent_serves = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    try:
        return torch_dist.TCPStore(addr, port, world, is_master=rank == 0 and not agent_serves, timeout=timeout,
                             wait_for_workers=False, multi_tenant=True)
    except RuntimeError as err:
        who = "torchrun's agent" if agent_serves else "rank 0"
        raise ProcessGroupInitError(
            f"rank {rank}: could not reach the store that {who} serves at {addr}:{port} within "
            f"trainer.dist_init_timeout_s={timeout_s:g} s ({err}). Is rank 0 running, and is "
            f"{addr}:{port} reachable from this node?"
        ) from err


def _join_round(store: torch_dist.Store, rank: int, world: int, timeout_s: float) -> torch_dist.Store:
    """A store namespace that exactly this launch's `world` ranks share, fresh for every restart.

    Rank 0 publishes a new random token; every other rank announces itself under the token it reads
    (with a nonce of its own) until rank 0 answers with that nonce. A token left by the rank 0 of an
    earlier launch is never answered (that process is gone), so a rank that read it waits for the
    new one instead of joining a dead group.
    """
    deadline = time.monotonic() + timeout_s
    if rank == 0:
        token = uuid.uuid4().hex
        store.set(_ROUND_KEY, token)
        hellos = [f"synctrain/pg/{token}/hello/{r}" for r in range(1, world)]
        if hellos:
            try:
                store.wait(hellos, datetime.timedelta(seconds=timeout_s))
            except RuntimeError as err:
                missing = [r for r, key in enumerate(hellos, start=1) if not store.check([key])]
                raise ProcessGroupInitError(
                    f"rank 0: rank(s) {_ranges(missing)} of {world} did not join within "
                    f"trainer.dist_init_timeout_s={timeout_s:g} s: they did not start, crashed before "
                    "creating the process group, or are stuck (see their logs)"
                ) from err
            nonces = store.multi_get(hellos)
            store.multi_set([f"synctrain/pg/{token}/welcome/{r}" for r in range(1, world)], nonces)
        return torch_dist.PrefixStore(f"synctrain/pg/{token}/", store)

    nonce = uuid.uuid4().hex.encode()
    token, pause = None, 0.01
    while time.monotonic() < deadline:
        if store.check([_ROUND_KEY]):
            current = store.get(_ROUND_KEY).decode()
            if current != token:
                token = current
                store.set(f"synctrain/pg/{token}/hello/{rank}", nonce)
            welcome = f"synctrain/pg/{token}/welcome/{rank}"
            if store.check([welcome]) and store.get(welcome) == nonce:
                return torch_dist.PrefixStore(f"synctrain/pg/{token}/", store)
        time.sleep(pause)
        pause = min(pause * 1.5, 0.5)  # quick when rank 0 is ready, light on the store when it is not
    raise ProcessGroupInitError(
        f"rank {rank}: rank 0 did not admit this rank to the process group within "
        f"trainer.dist_init_timeout_s={timeout_s:g} s: rank 0 did not start, crashed before creating "
        "the process group, or is stuck (see its log)")


def _ranges(ranks: list[int]) -> str:
    """[1, 2, 3, 7] -> "1-3, 7": readable even when hundreds of ranks are missing."""
    parts: list[str] = []
    for r in ranks:
        if parts and r == int(parts[-1].split("-")[-1]) + 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{r}"
        else:
            parts.append(str(r))
    return ", ".join(parts)


def destroy() -> None:
    """Tear every group down (safe to call when none exists), their threads included.

    The groups' threads end when their last reference goes: SyncBN's cached groups are dropped and the
    garbage collected here, while the interpreter is whole, rather than during its shutdown.
    """
    if is_initialized():
        torch_dist.destroy_process_group()
        release_groups()
        gc.collect()
