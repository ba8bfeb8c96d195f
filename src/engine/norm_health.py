"""Norm health: count normalisation layers and check that every rank holds the same tensors.

Replicas drifting apart is silent in DDP: gradients are averaged, but anything that is not a
gradient (BN running statistics with per-rank BN, a buffer written by only one rank, a bad seed)
diverges quietly and the evaluated model is then whichever rank happens to evaluate. Checking
checksums of every parameter and buffer across ranks turns that into a log line.
"""
from __future__ import annotations

import hashlib
import logging
import torch
from torch import nn

from src import comm
from src.models import count_norm_layers

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
    per_rank = comm.all_gather_object(tensor_digests(model))
    reference = per_rank[0]
    return sorted({name for digests in per_rank[1:] for name, d in digests.items() if reference.get(name) != d})


def check_norm_health(model: nn.Module, when: str, strict: bool) -> list[str]:
    """Log the norm layers and whether every rank holds the same tensors; raise on a mismatch if `strict`."""
    counts = dict(sorted(count_norm_layers(model).items()))
    bad = mismatched_tensors(model)
    summary = ", ".join(f"{n} x{c}" for n, c in counts.items()) or "no norm layers"
    if not bad:
        log.info("norm health (%s): %s; parameters and buffers identical on %d rank(s)", when, summary,
                 comm.get_world_size())
        return bad
    message = (f"norm health ({when}): {len(bad)} tensors differ across ranks, e.g. {bad[:5]} "
               f"(norm layers: {summary})")
    if strict:
        raise RuntimeError(message)
    log.warning(message)
    return bad
