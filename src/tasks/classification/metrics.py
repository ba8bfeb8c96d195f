"""Classification metrics: which samples have their target among the k highest logits (top-k accuracy in
percent, 0-100)."""
from __future__ import annotations

import math

import torch


def topk_correct(logits: torch.Tensor, targets: torch.Tensor, ks: tuple[int, ...] = (1, 5)) -> torch.Tensor:
    """Per-sample hit flags [N, len(ks)] (bool): is the target among the k highest logits.

    k larger than the number of classes is clamped to it (top-5 of a 3-class problem is always a hit).
    Ties are broken by torch.topk, which is deterministic for a given input.
    """
    if logits.dim() != 2:
        raise ValueError(f"expected logits of shape [N, num_classes], got {tuple(logits.shape)}")
    num_classes = logits.shape[1]
    kmax = min(max(ks), num_classes)
    top = logits.topk(kmax, dim=1).indices  # [N, kmax], best first
    hits = top.eq(targets.view(-1, 1))  # [N, kmax]
    cumulative = hits.cumsum(dim=1).bool()  # hit within the first j+1 guesses
    cols = [min(k, num_classes) - 1 for k in ks]
    return cumulative[:, cols]


def topk_accuracy(logits: torch.Tensor, targets: torch.Tensor, ks: tuple[int, ...] = (1, 5)) -> list[float]:
    """Top-k accuracies in percent for each k in ks (NaN for an empty batch)."""
    if targets.numel() == 0:
        return [math.nan for _ in ks]
    hits = topk_correct(logits, targets, ks)
    return [100.0 * float(hits[:, j].sum()) / targets.numel() for j in range(len(ks))]
