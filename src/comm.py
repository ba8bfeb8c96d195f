"""The single gateway to torch.distributed's collectives for everything outside src/syncbn/: rank helpers,
barrier, all_gather of tensors and objects, reductions, broadcast, zero_first, timeout detection.

Forming and tearing down the process group is src/process_group.py's job. Every helper here works, as a no-op or the obvious identity, in a plain one-process run
(`python train.py`), so callers never branch on whether a process group exists.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

import torch
import torch.distributed as dist

from src.errors import UserError


def is_initialized() -> bool:
    """True when a default process group exists."""
    return dist.is_available() and dist.is_initialized()


def get_world_size() -> int:
    """Number of processes in the default group (1 without one)."""
    return dist.get_world_size() if is_initialized() else 1


def get_rank() -> int:
    """Global rank (0 without a process group)."""
    return dist.get_rank() if is_initialized() else 0


def get_local_rank() -> int:
    """Rank within this node, as torchrun sets it."""
    return int(os.environ.get("LOCAL_RANK", 0))


def get_local_world_size() -> int:
    """Number of processes on this node, as torchrun sets it."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", 1))


def get_node_rank() -> int:
    """Index of this node: torchrun's GROUP_RANK, else derived from the global and local ranks."""
    if "GROUP_RANK" in os.environ:
        return int(os.environ["GROUP_RANK"])
    return get_rank() // max(get_local_world_size(), 1)


def is_main_process() -> bool:
    """True on global rank 0: the only rank that writes logs, events and checkpoints."""
    return get_rank() == 0


def is_timeout(err: BaseException) -> bool:
    """True for the error a collective raises when its process group's timeout expires.

    gloo raises a plain RuntimeError ("Timed out waiting 20000ms for recv operation"), so this goes by
    the text, and only while a process group exists (a one-process run has no collectives to time out).
    """
    text = str(err).lower()
    return is_initialized() and isinstance(err, RuntimeError) and ("timed out" in text or "timeout" in text)


def barrier() -> None:
    """Wait for every rank; a no-op in one process."""
    if not is_initialized():
        return
    if dist.get_backend() == "nccl":
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's picklable `obj`, in rank order."""
    if not is_initialized():
        return [obj]
    out: list[Any] = [None] * get_world_size()
    dist.all_gather_object(out, obj)
    return out


def gather_object(obj: Any, dst: int = 0) -> list[Any] | None:
    """Every rank's picklable `obj`, in rank order, on rank `dst`; None on the other ranks."""
    if not is_initialized():
        return [obj]
    out: list[Any] | None = [None] * get_world_size() if get_rank() == dst else None
    dist.gather_object(obj, out, dst=dst)
    return out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank `src`'s `obj` on every rank."""
    if not is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_reduce(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """In-place all_reduce with op "sum", "mean", "max" or "min"; returns the tensor."""
    if not is_initialized():
        return tensor
    ops = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    if op not in ops:
        raise ValueError(f"unknown reduce op {op!r}; expected one of {sorted(ops)}")
    dist.all_reduce(tensor, op=ops[op])
    if op == "mean":
        tensor.div_(get_world_size())
    return tensor


def any_rank(flag: bool) -> bool:
    """True on every rank when `flag` is True on at least one (one all-reduce of one integer)."""
    if not is_initialized():
        return bool(flag)
    t = torch.tensor([int(bool(flag))], dtype=torch.int32, device=_collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def reduce_dict(values: dict[str, float], average: bool = True) -> dict[str, float]:
    """Sum (or average) a dict of scalars over ranks in one collective; same keys on every rank."""
    if not is_initialized() or not values:
        return dict(values)
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=_collective_device())
    all_reduce(t, "mean" if average else "sum")
    return {k: float(v) for k, v in zip(keys, t.tolist())}


def all_gather_tensor(tensor: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's tensor, in rank order; the first dimension may differ between ranks.

    Exact evaluation gives ranks uneven shards, and all_gather needs equal shapes, so sizes are
    exchanged first and each tensor is padded to the largest, then trimmed.
    """
    if not is_initialized():
        return [tensor]
    device = _collective_device()
    local = tensor.to(device)
    sizes = all_gather_object(local.shape[0])
    max_size = max(sizes)
    if local.shape[0] < max_size:
        pad = local.new_zeros((max_size - local.shape[0],) + tuple(local.shape[1:]))
        local = torch.cat([local, pad])
    out = [torch.empty_like(local) for _ in sizes]
    dist.all_gather(out, local.contiguous())
    return [t[:n].to(tensor.device) for t, n in zip(out, sizes)]


def _collective_device() -> torch.device:
    if is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@contextlib.contextmanager
def zero_first(local: bool = True) -> Iterator[None]:
    """Run the body on rank 0 (of each node when `local`) first, then on the others.

    Used for dataset download and extraction: one process per node writes, the rest read what it
    wrote. If the first process fails, every other rank raises a RuntimeError naming the failure
    instead of waiting forever at a barrier; a UserError (no network, files absent) is raised as the
    same UserError on every rank, so that the message is printed once (src/commands/user_errors.py).
    """
    if not is_initialized():
        yield
        return
    leader = get_local_rank() == 0 if local else get_rank() == 0
    if leader:
        try:
            yield
        except BaseException as exc:  # report to the others, then re-raise here
            user = isinstance(exc, UserError)
            _exchange_leader_status(local, (user, str(exc) if user else f"{type(exc).__name__}: {exc}"))
            raise
        _exchange_leader_status(local, None)
        return
    leader_error = _exchange_leader_status(local, None)
    if leader_error is not None:
        user, text = leader_error
        if user:
            raise UserError(text)
        who = "local rank 0 of this node" if local else "rank 0"
        raise RuntimeError(f"{who} failed, so this rank stops too: {text}")
    yield


def _exchange_leader_status(local: bool, error: tuple[bool, str] | None) -> tuple[bool, str] | None:
    """All ranks meet here once; returns the error (or None) of this rank's leader."""
    statuses = all_gather_object((get_node_rank(), get_local_rank(), get_rank(), error))
    for node, local_rank, rank, err in statuses:
        if local and node == get_node_rank() and local_rank == 0:
            return err
        if not local and rank == 0:
            return err
    return None
