"""The two collectives of SyncBN: one all_gather of packed statistics, one all_reduce of packed grads.

Nothing here sets a timeout: every collective inherits the timeout of its process group
(`init_process_group(timeout=...)`), so a rank that never arrives fails the others instead of hanging.
`call_counts` records how many collectives this process issued; the tests use it to prove "exactly one
per forward, one per backward, none in eval" (incrementing a dict is negligible next to a collective).
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist

call_counts: dict[str, int] = {"all_gather": 0, "all_reduce": 0}

# torch >= 2.x names the flat gather `all_gather_single` (all_gather_into_tensor is its deprecated
# alias). Both accept a flat [W * n] output on gloo and NCCL; gloo rejects the stacked [W, n] form,
# so we always gather into a flat buffer and view it as [W, n] (a view, no copy).
_gather_single = getattr(dist, "all_gather_single", None) or getattr(dist, "all_gather_into_tensor", None)


def process_group_available() -> bool:
    """True when torch.distributed is built in and a default process group exists."""
    return dist.is_available() and dist.is_initialized()


def resolve_group(process_group: Optional[Any], group_size: Optional[int] = None) -> tuple[Optional[Any], int]:
    """(group, size) for a layer's process_group (None = WORLD, looked up now); size 1 without a group.

    group_size, when set, replaces process_group: this rank's group of that many consecutive ranks
    (created beforehand by `groups.create_rank_groups`).
    """
    if not process_group_available():
        return None, 1
    if group_size is not None:
        from .groups import rank_group

        process_group = rank_group(group_size)
    group = process_group if process_group is not None else dist.group.WORLD
    size = dist.get_world_size(group)
    if size < 1:
        raise RuntimeError(
            f"this rank ({dist.get_rank()}) is not a member of the SyncBatchNorm's process group; "
            "give each rank a group it belongs to (every rank calls new_group for every group, then "
            "passes its own one to convert_sync_batchnorm)"
        )
    return group, size


def all_gather_stats(local: torch.Tensor, group: Any, world_size: int) -> torch.Tensor:
    """Gather every rank's packed [2C+1] statistics into one [W, 2C+1] tensor (one collective)."""
    call_counts["all_gather"] += 1
    local = local.contiguous()
    if _gather_single is not None:
        flat = torch.empty(world_size * local.numel(), dtype=local.dtype, device=local.device)
        _gather_single(flat, local, group=group)
        return flat.view(world_size, local.numel())
    # Older torch without a single-tensor gather: the list form is still exactly one collective.
    parts = [torch.empty_like(local) for _ in range(world_size)]
    dist.all_gather(parts, local, group=group)
    return torch.stack(parts)


def all_reduce_grads(packed: torch.Tensor, group: Any) -> torch.Tensor:
    """Sum the packed [2C] backward reductions over the group, in place (one collective)."""
    call_counts["all_reduce"] += 1
    dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=group)
    return packed
