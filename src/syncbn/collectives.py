"""SyncBN's collectives: two all_reduces of statistics per forward, one all_reduce of grads per backward.

The forward's exchange is two sums (functions.py: [n, n*mean], then the ranks' deviation sums, together Chan's
merge), so each rank sends and receives 2C+1 values per layer whatever the world size. The all_gather of every
rank's [count, mean, M2] row is the alternative a layer may ask for (one collective, W(2C+1) values).

Both are functional collectives (`torch.ops._c10d_functional`): they take the process group by
*name* and return a new tensor, so torch.compile traces them into the graph (Inductor then schedules
them like any other op) and eager mode runs the very same ops. A process-group object never enters
the traced code: `resolve_group` turns the layer's group into (name, size) first.

Nothing here sets a timeout: every collective inherits the timeout of its process group
(`init_process_group(timeout=...)`), so a rank that never arrives fails the others instead of hanging.
`call_counts` records how many collectives this process issued in eager mode, and how many values it
received from them; the tests use it to prove "exactly two per forward, one per backward, none in eval" and
the payload (incrementing a dict is negligible next to a collective). Compiled code does not touch it (a Python side effect in a graph would be replayed as a
constant and guarded on); the compile tests count the collective ops in the compiled graphs instead.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist

call_counts: dict[str, int] = {"all_gather": 0, "all_reduce": 0, "received": 0}

_c10d = torch.ops._c10d_functional


def process_group_available() -> bool:
    """True when torch.distributed is built in and a default process group exists."""
    return dist.is_available() and dist.is_initialized()


def resolve_group(process_group: Optional[Any], group_size: Optional[int] = None) -> tuple[str, int]:
    """(group name, size) for a layer's process_group (None = WORLD, looked up now); ("", 1) without a group.

    None resolves to the statistics group of `groups.create_stats_group` when this process created one
    (same ranks as WORLD, without DDP's gradient buckets queued on it), else to WORLD.

    group_size, when set, replaces process_group: this rank's group of that many consecutive ranks
    (created beforehand by `groups.create_rank_groups`).
    """
    if not process_group_available():
        return "", 1
    if group_size is not None:
        from .groups import rank_group

        process_group = rank_group(group_size)
    if process_group is None:
        from .groups import stats_group

        process_group = stats_group()  # WORLD's ranks on a group of their own, when one was created
    group = process_group if process_group is not None else dist.group.WORLD
    size = dist.get_world_size(group)
    if size < 1:
        raise RuntimeError(
            f"this rank ({dist.get_rank()}) is not a member of the SyncBatchNorm's process group; "
            "give each rank a group it belongs to (every rank calls new_group for every group, then "
            "passes its own one to convert_sync_batchnorm)"
        )
    return group.group_name, size


def all_reduce_stats(packed: torch.Tensor, group_name: str) -> torch.Tensor:
    """The group sum of one of the forward's packed statistics ([C+1] mean sums, [C] deviation sums), as a new
    tensor (one collective)."""
    if not torch.compiler.is_compiling():
        call_counts["all_reduce"] += 1
        call_counts["received"] += packed.numel()
    return _c10d.wait_tensor(_c10d.all_reduce(packed, "sum", group_name))


def all_gather_stats(local: torch.Tensor, group_name: str, world_size: int) -> torch.Tensor:
    """Gather every rank's packed [2C+1] statistics into one [W, 2C+1] tensor (one collective)."""
    if not torch.compiler.is_compiling():
        call_counts["all_gather"] += 1
        call_counts["received"] += world_size * local.numel()
    # Gathered flat along dim 0 (what gloo and NCCL both take), then viewed as [W, 2C+1]: no copy.
    flat = _c10d.all_gather_into_tensor(local.contiguous(), world_size, group_name)
    return _c10d.wait_tensor(flat).view(world_size, local.numel())


def all_reduce_grads(packed: torch.Tensor, group_name: str) -> torch.Tensor:
    """The group sum of the packed [2C] backward reductions, as a new tensor (one collective)."""
    if not torch.compiler.is_compiling():
        call_counts["all_reduce"] += 1
        call_counts["received"] += packed.numel()
    return _c10d.wait_tensor(_c10d.all_reduce(packed, "sum", group_name))
