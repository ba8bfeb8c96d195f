"""Norm health: count normalisation layers, check replicas are identical, sync per-rank BN buffers.

Replicas drifting apart is silent in DDP: gradients are averaged, but anything that is not a
gradient (BN running statistics with per-rank BN, a buffer written by only one rank, a bad seed)
diverges quietly and the evaluated model is then whichever rank happens to evaluate. Checking
checksums of every parameter and buffer across ranks turns that into a log line.
"""
from __future__ import annotations

import hashlib
import logging
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from src import dist
from src.models import count_norm_layers
from src.models.norms import per_rank_statistics

log = logging.getLogger(__name__)


def tensor_digests(model: nn.Module) -> dict[str, str]:
    """A digest of the exact bytes of every parameter and buffer, by state_dict name."""
    digests = {}
    for name, tensor in model.state_dict().items():
        data = tensor.detach().cpu().contiguous().reshape(-1)  # 1-D so 0-d buffers can be viewed as bytes
        digests[name] = hashlib.blake2b(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"",
                                        digest_size=16).hexdigest()
    return digests


def mismatched_tensors(model: nn.Module) -> list[str]:
    """Names of parameters/buffers that are not bit-identical on all ranks (a collective: call on every rank)."""
    per_rank = dist.all_gather_object(tensor_digests(model))
    reference = per_rank[0]
    return sorted({name for digests in per_rank[1:] for name, d in digests.items() if reference.get(name) != d})


def buffer_sync_mode(cfg: Any) -> str:
    """How per-rank BN statistics are made equal before evaluations and checkpoints: trainer.norm_buffer_sync
    when they can differ (norm=bn, or syncbn with small groups or a communication-saving mode; see
    src.models.norms.per_rank_statistics) and DDP does not broadcast buffers every forward, else "none"."""
    if per_rank_statistics(cfg.norm, dist.get_world_size()) and not cfg.trainer.broadcast_buffers:
        return cfg.trainer.norm_buffer_sync
    return "none"


def sync_bn_buffers(model: nn.Module, mode: str) -> int:
    """Make BN running statistics equal on all ranks: "reduce" averages them, "broadcast" takes rank 0's.

    Needed only for per-rank BN (norm=bn without DDP's broadcast_buffers): each rank's running stats
    then saw only its own shard. Returns the number of layers synchronised (a collective).
    """
    if mode == "none" or dist.get_world_size() == 1:
        return 0
    layers = [m for m in model.modules() if isinstance(m, _BatchNorm) and m.track_running_stats
              and m.running_mean is not None]
    for layer in layers:
        for buf in (layer.running_mean, layer.running_var):
            if mode == "reduce":
                flat = buf.detach().double()
                dist.all_reduce(flat, "mean")
            else:
                flat = dist.all_gather_tensor(buf.detach().reshape(1, -1))[0].reshape(buf.shape)
            buf.copy_(flat.to(buf.dtype))
    return len(layers)


def check_norm_health(model: nn.Module, when: str, strict: bool) -> list[str]:
    """Log the norm layers and whether every rank holds the same tensors; raise on a mismatch if `strict`."""
    counts = dict(sorted(count_norm_layers(model).items()))
    bad = mismatched_tensors(model)
    summary = ", ".join(f"{n} x{c}" for n, c in counts.items()) or "no norm layers"
    if not bad:
        log.info("norm health (%s): %s; parameters and buffers identical on %d rank(s)", when, summary,
                 dist.get_world_size())
        return bad
    message = (f"norm health ({when}): {len(bad)} tensors differ across ranks, e.g. {bad[:5]} "
               f"(norm layers: {summary})")
    if strict:
        raise RuntimeError(message)
    log.warning(message)
    return bad
