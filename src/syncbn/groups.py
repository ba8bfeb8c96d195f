"""Groups of consecutive ranks for `group_size`: created once, collectively, then looked up by the layers.

PyTorch's rule for subgroups is that every rank calls `new_group` for every group, in the same order,
even for groups it is not in. That is a collective, so it cannot happen lazily inside a layer's forward
(an eval-only or rank-0-only forward would deadlock the others), nor at model-build time (the model may
be built before `init_process_group`). So: `create_rank_groups(k)` is called by every rank once after
`init_process_group` (the trainer does it for `norm.group_size`), and layers with `group_size=k` look
their group up here at forward time. Layers hold only the integer, not the ProcessGroup object, so a
model stays deep-copyable (EMA) and picklable.
"""
from __future__ import annotations

import datetime
from typing import Any, Optional

import torch.distributed as dist

# group_size -> (the WORLD group it was created in, this rank's group). Keyed on WORLD so a process that
# tears its process group down and starts a new one never gets a group of the old one.
_GROUPS: dict[int, tuple[Any, Any]] = {}
# "stats" -> (the WORLD group it was created in, a group of all of WORLD's ranks for SyncBN alone).
_STATS: dict[str, tuple[Any, Any]] = {}


def check_group_size(group_size: Any, world_size: Optional[int] = None, *, key: str = "group_size") -> None:
    """The one rule for group_size, wherever it is given (norm.group_size in a config, configure_sync, group
    creation): None (the whole group) or an int >= 1 that divides world_size, when that is known.
    ValueError naming `key` otherwise."""
    if group_size is None:
        return
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"{key} must be an int >= 1, or null/None for all ranks; got {group_size!r}")
    if world_size is not None and world_size % group_size:
        divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
        raise ValueError(f"{key}={group_size} must divide the number of processes ({world_size}) into groups of "
                         f"consecutive ranks: use one of {divisors}, or null/None for all ranks")


def create_rank_groups(group_size: int, timeout_s: Optional[float] = None) -> Any:
    """Create the groups {0..k-1}, {k..2k-1}, ... of WORLD (a collective: every rank calls it); this rank's group.

    Idempotent per process group: a second call with the same size returns the same group. group_size equal
    to the world size returns WORLD itself (no new group); timeout_s defaults to torch's for new groups.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("create_rank_groups needs an initialised default process group: call it after "
                           "init_process_group, on every rank")
    world = dist.group.WORLD
    if group_size is None:
        raise ValueError("create_rank_groups needs a group size (an int >= 1); None means the whole group, which needs "
                         "no groups of its own")
    check_group_size(group_size, dist.get_world_size())
    cached = _GROUPS.get(group_size)
    if cached is not None and cached[0] is world:
        return cached[1]
    if group_size == dist.get_world_size():
        group = world
    else:
        timeout = datetime.timedelta(seconds=timeout_s) if timeout_s is not None else None
        group, _ = dist.new_subgroups(group_size=group_size, timeout=timeout)
    _GROUPS[group_size] = (world, group)
    return group


def release_groups() -> None:
    """Forget the groups made here, after `torch.distributed.destroy_process_group()`.

    destroy_process_group shuts the groups down, but a group's gloo threads live until its last Python
    reference goes. Kept in these caches, the threads would be torn down during interpreter shutdown, when a
    thread that still needs the interpreter makes the process abort (SIGABRT instead of the run's exit code).
    """
    _GROUPS.clear()
    _STATS.clear()


def rank_group(group_size: int) -> Any:
    """This rank's group of `group_size` consecutive ranks, created earlier by `create_rank_groups`."""
    cached = _GROUPS.get(group_size)
    if cached is None or cached[0] is not dist.group.WORLD:
        raise RuntimeError(
            f"a SyncBatchNorm layer has group_size={group_size}, but its groups were not created in this "
            f"process group: call src.syncbn.create_rank_groups({group_size}) on every rank right after "
            "init_process_group (the trainer does this for norm.group_size)"
        )
    return cached[1]


def create_stats_group(timeout_s: Optional[float] = None) -> Any:
    """A group of all WORLD's ranks for SyncBN's collectives alone (a collective: every rank calls it); idempotent.

    Layers whose process_group is None (WORLD) then communicate on it instead of WORLD. Why: DDP issues
    its gradient-bucket all-reduces on WORLD during the backward, and a process group runs its work in
    order, so SyncBN's backward all_reduce on WORLD waits behind whichever buckets were issued before
    it. On a group of its own it does not (scripts/bench_sync_cost.py measures both). Same ranks, so the
    statistics and the results are the same. With one process it returns WORLD.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("create_stats_group needs an initialised default process group: call it after "
                           "init_process_group, on every rank")
    world = dist.group.WORLD
    cached = _STATS.get("stats")
    if cached is not None and cached[0] is world:
        return cached[1]
    if dist.get_world_size() == 1:
        group = world
    else:
        timeout = datetime.timedelta(seconds=timeout_s) if timeout_s is not None else None
        group = dist.new_group(timeout=timeout)
    _STATS["stats"] = (world, group)
    return group


def stats_group() -> Optional[Any]:
    """The group `create_stats_group` made for the current WORLD, or None (then layers use WORLD itself)."""
    cached = _STATS.get("stats")
    if cached is None or cached[0] is not dist.group.WORLD:
        return None
    return cached[1]
