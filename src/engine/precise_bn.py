"""Precise BatchNorm statistics: every BatchNorm's running_mean / running_var recomputed as the exact population
statistics of its inputs over a number of batches on every rank (trainer.precise_bn_batches).

During training the running statistics are an exponential average of small, noisy batch statistics; this
replaces them by the mean and unbiased variance of everything the layer saw in `num_batches` forwards per
rank, identical (bit for bit) on every rank:
- each layer's input is observed by a forward pre-hook; per batch and channel its count n, mean and M2 (sum of
  squared deviations) are computed in float64 and merged into the layer's running triple with Chan et al.'s
  pairwise update, so batches of any size weigh by their counts (never an average of averages);
- the ranks' triples travel in one all_gather (float64) and every rank merges them in rank order with the same
  update: the same operations on the same numbers, hence the same bits everywhere;
- running_var = M2 / (n - 1) (unbiased), BatchNorm's own convention for its running variance.

The models run in training mode (as fvcore's update_bn_stats does: a later layer sees inputs normalised with
batch statistics, as in training; SyncBN layers normalise over the ranks and communicate) under
torch.no_grad. Afterwards every module's training flag, every BatchNorm's num_batches_tracked (and with it
SyncBN's sync_every schedule) and all gradients are as before, parameters untouched; only running_mean and
running_var change. Every rank makes exactly `num_batches` forwards of every model, re-iterating its batches
when they run out, so ranks with fewer or smaller batches never leave a peer waiting in a SyncBN collective.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from src import comm

# (n, mean (C,), M2 (C,)): n a host float (counts are exact in float64 up to 2**53), mean and M2 float64 tensors
Moments = tuple[float, torch.Tensor, torch.Tensor]


@dataclass
class PreciseBNReport:
    """What one model's recalibration did (the same on every rank)."""

    layers: int = 0  # BatchNorm layers whose running statistics were recomputed
    skipped: list[str] = field(default_factory=list)  # layers that saw < 2 values per channel: left as they were
    values: int = 0  # values per channel behind the first recomputed layer, all ranks together
    seconds: float = 0.0


def batchnorm_layers(model: nn.Module) -> list[tuple[str, _BatchNorm]]:
    """Every BatchNorm with running statistics: nn.BatchNorm1d/2d/3d, nn.SyncBatchNorm, our SyncBatchNorm, timm's
    BatchNormAct2d (all torch _BatchNorm subclasses), in module order."""
    return [(name, m) for name, m in model.named_modules()
            if isinstance(m, _BatchNorm) and m.track_running_stats and m.running_mean is not None]


def batch_moments(x: torch.Tensor) -> Moments:
    """(n, mean, M2) per channel (dim 1) of one batch, in float64 (two-pass, so M2 is accurate)."""
    x = x.detach().double()
    dims = [0, *range(2, x.dim())]
    n = x.numel() // x.shape[1]
    var, mean = torch.var_mean(x, dim=dims, correction=0)
    return float(n), mean, var * n


def merge_moments(a: Moments, b: Moments) -> Moments:
    """Chan, Golub & LeVeque's pairwise update: the (n, mean, M2) of the union of two sets; either may be empty."""
    n_a, mean_a, m2_a = a
    n_b, mean_b, m2_b = b
    if n_b == 0:
        return a
    if n_a == 0:
        return b
    n = n_a + n_b
    delta = mean_b - mean_a
    return n, mean_a + delta * (n_b / n), m2_a + m2_b + delta * delta * (n_a * n_b / n)


def recompute_bn_stats(models: Sequence[nn.Module], batches: Iterable[Any], num_batches: int,
                       forward: Optional[Callable[[nn.Module, Any], Any]] = None) -> list[PreciseBNReport]:
    """Set every BatchNorm's running_mean / running_var in `models` to the population statistics of its inputs
    over `num_batches` batches of this rank and of every other rank (a collective: call it on every rank).

    Each batch goes through every model in turn (`forward(model, batch)`, default `model(batch)`), so an EMA
    copy is recalibrated on exactly the same inputs. `batches` is iterated again (iter() anew: a DataLoader's
    next pass) whenever it runs out before `num_batches`; every rank must pass the same `num_batches` and
    models with the same BatchNorm layers, which is checked first (one small collective) so that a mismatch
    is an error on every rank rather than a SyncBN collective waiting for a forward that never comes.
    """
    started = time.perf_counter()
    forward = forward or (lambda model, batch: model(batch))
    per_model = [batchnorm_layers(m) for m in models]
    _check_ranks_agree(num_batches, per_model)
    layers = [layer for named in per_model for _, layer in named]
    moments: dict[nn.Module, Moments] = {}
    flags = [(m, m.training) for model in models for m in model.modules()]
    saved = {layer: {k: v.detach().clone() for k, v in _buffers(layer).items()} for layer in layers}
    handles = [layer.register_forward_pre_hook(_observer(moments, layer)) for layer in layers]
    source = _repeat(batches)
    try:
        for model in models:
            model.train()
        with torch.no_grad():
            for _ in range(num_batches):
                batch = next(source)
                for model in models:
                    forward(model, batch)
    finally:
        source.close()
        for handle in handles:
            handle.remove()
        for module, training in flags:
            module.training = training
        for layer in layers:
            # load_state_dict, not copy_: it also makes SyncBN re-read its sync_every position from the restored
            # num_batches_tracked, so the passes above leave no trace in the layers' state.
            layer.load_state_dict(saved[layer], strict=False)
    merged = _merge_over_ranks([[moments.get(layer) for _, layer in named] for named in per_model], per_model)
    seconds = time.perf_counter() - started
    reports = []
    for named, totals in zip(per_model, merged):
        report = PreciseBNReport(seconds=seconds)
        for (name, layer), (n, mean, m2) in zip(named, totals):
            if n < 2:  # no unbiased variance from fewer than two values: keep what the layer had
                report.skipped.append(name)
                continue
            with torch.no_grad():
                layer.running_mean.copy_(mean.to(layer.running_mean))
                layer.running_var.copy_((m2 / (n - 1)).to(layer.running_var))
            report.layers += 1
            report.values = report.values or int(n)
        reports.append(report)
    return reports


def _buffers(layer: _BatchNorm) -> dict[str, torch.Tensor]:
    """The layer's own statistics buffers, under their state_dict keys."""
    names = ("running_mean", "running_var", "num_batches_tracked")
    return {k: getattr(layer, k) for k in names if getattr(layer, k, None) is not None}


def _observer(moments: dict[nn.Module, Moments], layer: nn.Module) -> Callable[..., None]:
    """A forward pre-hook folding each input batch of `layer` into moments[layer]."""
    def observe(module: nn.Module, args: tuple[Any, ...]) -> None:
        x = args[0]
        if x.numel() == 0:  # an empty batch (SyncBN allows them) adds nothing
            return
        batch = batch_moments(x)
        moments[layer] = batch if layer not in moments else merge_moments(moments[layer], batch)
    return observe


def _repeat(batches: Iterable[Any]) -> Iterator[Any]:
    """The batches, iterated again each time they run out; an error if a pass yields nothing."""
    while True:
        empty = True
        for batch in batches:
            empty = False
            yield batch
        if empty:
            raise ValueError("precise BatchNorm: the batches to recompute the statistics on are empty on rank "
                             f"{comm.get_rank()}")


def _check_ranks_agree(num_batches: int, per_model: list[list[tuple[str, _BatchNorm]]]) -> None:
    """Raise on every rank unless every rank runs the same number of forwards of the same BatchNorm layers."""
    if num_batches < 1:
        raise ValueError(f"precise BatchNorm needs at least one batch, got num_batches={num_batches}")
    mine = (num_batches, [[(name, layer.num_features) for name, layer in named] for named in per_model])
    everyone = comm.all_gather_object(mine)
    if any(other != mine for other in everyone):
        counts = [other[0] for other in everyone]
        raise ValueError(f"precise BatchNorm: the ranks disagree on the number of batches {counts} or on the "
                         "BatchNorm layers of the models; every rank must make the same forwards")


def _merge_over_ranks(local: list[list[Optional[Moments]]],
                      per_model: list[list[tuple[str, _BatchNorm]]]) -> list[list[Moments]]:
    """Every rank's (n, mean, M2) per layer, gathered in float64 and merged in rank order: the same on every rank."""
    parts = []
    for named, model_moments in zip(per_model, local):
        for (_, layer), m in zip(named, model_moments):
            if m is None:  # not reached on this rank
                m = (0.0, torch.zeros(layer.num_features, dtype=torch.float64),
                     torch.zeros(layer.num_features, dtype=torch.float64))
            n, mean, m2 = m
            parts.extend([torch.tensor([n], dtype=torch.float64), mean.cpu(), m2.cpu()])
    flat = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)
    rows = [row[0].cpu() for row in comm.all_gather_tensor(flat.unsqueeze(0))]  # one [1, L] per rank, rank order
    merged: list[list[Moments]] = []
    offset = 0
    for named in per_model:
        totals = []
        for _, layer in named:
            c = layer.num_features
            total: Moments = (0.0, torch.zeros(c, dtype=torch.float64), torch.zeros(c, dtype=torch.float64))
            for row in rows:
                total = merge_moments(total, (float(row[offset]), row[offset + 1:offset + 1 + c],
                                              row[offset + 1 + c:offset + 1 + 2 * c]))
            offset += 1 + 2 * c
            n, mean, m2 = total
            device = layer.running_mean.device
            totals.append((n, mean.to(device), m2.to(device)))
        merged.append(totals)
    return merged
