"""unwrap_model: the module that owns the parameters, inside DDP, DataParallel and torch.compile wrappers.

Builders (parameter groups), the trainer (EMA, checkpoints) and the evaluator all need the bare module:
its state_dict keys carry no `module.` / `_orig_mod.` prefix, and its forward never communicates.
`without_ddp` is what evaluation runs: no DDP, but a compiled bare model stays compiled; `eval_mode` runs a
block in eval mode and gives every submodule its mode back.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

from torch import nn


def unwrap_model(model: nn.Module) -> nn.Module:
    """The innermost module of any stack of DDP / DataParallel / torch.compile wrappers (else `model`)."""
    while True:
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):  # torch.compile's OptimizedModule
            model = model._orig_mod
        else:
            return model


def without_ddp(model: nn.Module) -> nn.Module:
    """`model` without DDP / DataParallel (whose forward may communicate); torch.compile around the bare model is kept."""
    inner = getattr(model, "_orig_mod", None)
    if isinstance(inner, nn.Module) and unwrap_model(inner) is inner:
        return model  # compiled bare model: its forward never communicates either
    return unwrap_model(model)


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Put `model` in eval mode for the block and restore every submodule's previous mode after it."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for m, training in modes:
            m.training = training
