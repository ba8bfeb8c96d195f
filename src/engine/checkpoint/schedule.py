"""A resumed run whose length changed (trainer.epochs, trainer.max_steps): its LR schedule, fitted to the new length.

The checkpoint's scheduler state holds the old length (a cosine's T_max, a poly's total_iters), and the optimizer's
lr is where that schedule left it. Loading them as they are would anneal to the old end and then go on along the old
curve (a cosine rises again). Instead the schedule is built for the new length and replayed to the checkpoint's step:
the lr is then what a run of the new length would have at this step (a step change, as in timm or detectron2, whose
schedules are functions of the step and the config). torch's chained schedulers compute each lr from the previous
one, so replaying is the only exact way; it costs about 20 microseconds per step done.
"""
from __future__ import annotations

import warnings
from typing import Callable

import torch
from torch.optim import lr_scheduler


def refit_schedule(optimizer: torch.optim.Optimizer,
                   build: Callable[[torch.optim.Optimizer], lr_scheduler.LRScheduler],
                   step: int) -> lr_scheduler.LRScheduler:
    """The schedule `build` makes, advanced by `step` optimizer steps, with the optimizer's lr set by it."""
    for group in optimizer.param_groups:
        group["lr"] = group.get("initial_lr", group["lr"])  # where a fresh run's schedule starts
    scheduler = build(optimizer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "lr_scheduler.step() before optimizer.step()": no optimizer step here
        for _ in range(step):
            scheduler.step()
    return scheduler
