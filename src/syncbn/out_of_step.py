"""SyncBatchNorm ranks out of step: number a model's layers, and name the layers whose exchange found its ranks apart.

Every exchange checks on the device that its group's ranks are at the same call of the same layer
(exchange_tag.py); when they are not, that step's statistics become NaN on every rank of the group and the layer
remembers the call. Training then fails on its non-finite loss; `check_in_step(model)` (or the trainer's finiteness
check, src/engine/finite.py) turns that into an error that names the layer and the likely causes. It reads the
device (one host read for the whole model), so call it where a read is cheap: when a loss is non-finite, every
so many steps, or after a step while debugging.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from .modules import SyncBatchNorm

CAUSES = ("Likely causes, on some ranks only: a training step (forward and backward) run with the model or a layer "
          "in eval mode (`.eval()`); `configure_sync` (sync_every, sync_until_step, group_size) called there or "
          "with other values; a SyncBatchNorm layer skipped (a branch on the data or on the rank). Every rank must "
          "run the same SyncBatchNorm layers in the same order and mode at every step")


class SyncBatchNormOutOfStepError(RuntimeError):
    """SyncBatchNorm layers exchanged statistics between ranks that were at different calls or layers."""


@dataclass(frozen=True)
class OutOfStep:
    """A layer whose exchange found its group out of step: its module path and this rank's call number then."""

    name: str
    call: int


def _layers(module: nn.Module) -> list[tuple[str, SyncBatchNorm]]:
    return [(name or "<root>", m) for name, m in module.named_modules() if isinstance(m, SyncBatchNorm)]


def number_layers(module: nn.Module) -> int:
    """Give every SyncBatchNorm in `module` its position (1, 2, ... in module order) as the layer identity its
    exchanges carry, so a layer skipped on some ranks is caught at the next layer; returns how many.

    convert_sync_batchnorm calls it; call it yourself on a model built with SyncBatchNorm layers directly (the same
    on every rank, outside a training step). Unnumbered layers still carry their call counts.
    """
    layers = _layers(module)
    for index, (_, layer) in enumerate(layers, start=1):
        layer.set_sync_layer_index(index)
    return len(layers)


def out_of_step_count(module: nn.Module) -> Optional[torch.Tensor]:
    """How many of `module`'s SyncBatchNorm layers found their ranks out of step, as a 0-d float64 tensor on the
    layers' device (no host read); None without such layers."""
    flags = [layer._exchange_tag.first_out_of_step[0] for _, layer in _layers(module)
             if layer._exchange_tag is not None]
    if not flags:
        return None
    device = flags[0].device
    return torch.isfinite(torch.stack([f.to(device) for f in flags])).sum(dtype=torch.float64)


def out_of_step_layers(module: nn.Module) -> list[OutOfStep]:
    """The layers of `module` whose exchange found their ranks out of step, earliest call first (module order
    among equals). One host read."""
    named = [(name, layer._exchange_tag) for name, layer in _layers(module) if layer._exchange_tag is not None]
    if not named:
        return []
    device = named[0][1].device
    firsts = torch.stack([tag.first_out_of_step[0].to(device) for _, tag in named]).tolist()
    found = [(call, order, name) for order, ((name, _), call) in enumerate(zip(named, firsts)) if call != float("inf")]
    return [OutOfStep(name, int(call)) for call, _, name in sorted(found)]


def out_of_step_message(found: list[OutOfStep]) -> str:
    """What went wrong, where, and what usually causes it, for the layers `out_of_step_layers` found."""
    first = found[0]
    others = "" if len(found) == 1 else (
        f" ({len(found) - 1} more layer(s) after it: " + ", ".join(f"'{f.name}'" for f in found[1:4])
        + (", ..." if len(found) > 4 else "") + ")")
    return (f"SyncBatchNorm's ranks are out of step: layer '{first.name}' exchanged its statistics, at its call "
            f"{first.call} on this rank, with ranks at another call or another layer{others}; those statistics were "
            f"made NaN on every rank of its group rather than left wrong. {CAUSES}.")


def check_in_step(module: nn.Module) -> None:
    """Raise SyncBatchNormOutOfStepError naming the first layer of `module` whose exchange found its ranks out of
    step (e.g. after a step, or when the loss is NaN); else return. One host read, no collective: every rank of
    the group reached the same verdict."""
    found = out_of_step_layers(module)
    if found:
        raise SyncBatchNormOutOfStepError(out_of_step_message(found))
