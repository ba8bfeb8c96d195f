"""src/engine/checkpoint/schedule.py: a resume with another length gets the LR schedule of that length at the
checkpoint's step, and goes on along it exactly as a run of that length would."""
from __future__ import annotations

import warnings

import pytest
import torch

from src.config import SchedConfig
from src.engine.checkpoint.schedule import refit_schedule
from src.engine.optim import build_scheduler


def _optimizer() -> torch.optim.Optimizer:
    """Two parameter groups with their own lr (as optim.head_lr_mult makes)."""
    groups = [{"params": [torch.nn.Parameter(torch.zeros(2))], "lr": 0.1},
              {"params": [torch.nn.Parameter(torch.zeros(2))], "lr": 0.5}]
    return torch.optim.SGD(groups, lr=0.1, momentum=0.9)


def _lrs(optimizer: torch.optim.Optimizer) -> list[float]:
    return [group["lr"] for group in optimizer.param_groups]


def _stepped(scheduler: torch.optim.lr_scheduler.LRScheduler, steps: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no optimizer step in these tests
        for _ in range(steps):
            scheduler.step()


@pytest.mark.parametrize("name", ["cosine", "poly", "step"])
def test_a_resume_with_another_length_continues_on_the_schedule_of_that_length(name: str) -> None:
    sched = SchedConfig(name=name, warmup_epochs=1, step_epochs=2)
    for old_total, new_total in ((16, 40), (40, 16)):  # longer, and shorter
        old_opt = _optimizer()
        old = build_scheduler(old_opt, sched, steps_per_epoch=4, total_steps=old_total)
        _stepped(old, 10)  # the interrupted run: 10 steps done

        # The resume: the checkpoint's optimizer and scheduler loaded as they are, then refitted.
        opt = _optimizer()
        build_scheduler(opt, sched, steps_per_epoch=4, total_steps=new_total).load_state_dict(old.state_dict())
        opt.load_state_dict(old_opt.state_dict())
        resumed = refit_schedule(opt, lambda o: build_scheduler(o, sched, steps_per_epoch=4, total_steps=new_total), 10)

        ref_opt = _optimizer()  # a run of the new length from its start
        ref = build_scheduler(ref_opt, sched, steps_per_epoch=4, total_steps=new_total)
        _stepped(ref, 10)
        assert _lrs(opt) == _lrs(ref_opt)
        if name == "cosine":
            assert _lrs(opt) != _lrs(old_opt)  # the lengths give different lrs at step 10: the refit is seen
        for _ in range(new_total - 10):
            _stepped(resumed, 1)
            _stepped(ref, 1)
            assert _lrs(opt) == _lrs(ref_opt)
