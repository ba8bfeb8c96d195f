"""unwrap_model: the module that owns the parameters, inside DDP, DataParallel and torch.compile wrappers.

Builders (parameter groups), the trainer (EMA, checkpoints) and the evaluator all need the bare module:
its state_dict keys carry no `module.` / `_orig_mod.` prefix, and its forward never communicates.
"""
from __future__ import annotations

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
