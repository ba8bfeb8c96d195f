"""FiniteGuard: a non-finite loss or gradient norm stops the run on every rank, naming the step and the value.

Each step's loss (and gradient norm, when trainer.grad_clip_norm computes one) is checked on the device
and remembered there, so training never waits for the host. `check()` looks at what accumulated, once
per `trainer.log_every` steps and before every evaluation and checkpoint: one small all_reduce, the
same verdict on every rank. A diverged run therefore stops before it could write non-finite weights,
and the last checkpoint on disk keeps the last finite ones.

With fp16's GradScaler a non-finite step is routine: the scaler skips it and lowers the loss scale. Such
steps are allowed; the run stops only when every step since the previous check was non-finite (the
scale can no longer rescue it) or when the weights themselves are no longer finite.

SyncBatchNorm ranks out of step (src/syncbn/out_of_step.py) make their step's statistics NaN, and their layers
remember it on the device: the same all_reduce carries how many layers did, and then the error is
SyncBatchNormOutOfStepError naming the first layer and the likely causes instead of "diverged" (also with fp16,
whose skipped steps would otherwise hide it).
"""
from __future__ import annotations

from typing import Mapping, Optional

import torch
from torch import nn

from src import comm
from src.syncbn import SyncBatchNormOutOfStepError, out_of_step_count, out_of_step_layers
from src.syncbn.out_of_step import out_of_step_message

CAUSES = ("Usual causes: a learning rate too high for this batch size (optim.lr; with optim.reference_batch_size "
          "it is scaled by the effective batch), fp16 overflow (trainer.amp=fp16: try bf16, or "
          "trainer.grad_clip_norm), or bad data (NaN/inf pixels, labels outside [0, num_classes))")


class NonFiniteError(RuntimeError):
    """Training produced a NaN or infinite loss, gradient norm or weight."""


class FiniteGuard:
    """Device-side record of non-finite steps since the last check; `check()` decides on every rank at once."""

    def __init__(self, device: torch.device, skipped_steps_allowed: bool = False,
                 model: Optional[nn.Module] = None) -> None:
        self.device, self.skipped_steps_allowed = device, skipped_steps_allowed
        self.model = model  # whose SyncBatchNorm layers may have found their ranks out of step
        self._reset()

    def _reset(self) -> None:
        self.steps = 0
        self.bad_steps = torch.zeros((), dtype=torch.int64, device=self.device)
        # First bad step since the last check: its number, what was bad (1 loss, 2 gradient norm), the value.
        self.first = torch.tensor([-1.0, 0.0, 0.0], dtype=torch.float64, device=self.device)

    def observe(self, step: int, loss: torch.Tensor, grad_norm: Optional[torch.Tensor] = None) -> None:
        """Record step `step`'s loss (and gradient norm): tensor ops only, no host sync."""
        loss = loss.detach().double().reshape(())
        bad_loss = ~torch.isfinite(loss)
        bad = bad_loss
        if grad_norm is not None:
            grad_norm = grad_norm.detach().double().reshape(())
            bad = bad | ~torch.isfinite(grad_norm)
            value = torch.where(bad_loss, loss, grad_norm)
        else:
            value = loss
        kind = torch.where(bad_loss, 1.0, 2.0).to(torch.float64)
        step_t = torch.full((), float(step), dtype=torch.float64, device=self.device)  # no host-to-device copy
        self.first = torch.where(bad & (self.first[0] < 0), torch.stack([step_t, kind, value]), self.first)
        self.bad_steps += bad.to(torch.int64)
        self.steps += 1

    def check(self, weights: Mapping[str, torch.Tensor], where: str, context: str = "") -> None:
        """Raise NonFiniteError on every rank when this or any rank saw a failure, or a tensor of `weights`
        (name -> tensor) is not finite (a collective). `context` (e.g. the current LR) joins the message."""
        tensors = [w.detach() for w in weights.values()]
        norm = torch.nn.utils.get_total_norm(tensors) if tensors else torch.zeros((), device=self.device)
        out_of_step = out_of_step_count(self.model) if self.model is not None else None
        flags = torch.stack([self.bad_steps.double(), torch.full((), float(self.steps), dtype=torch.float64,
                                                                 device=self.device),
                             (~torch.isfinite(norm)).to(device=self.device, dtype=torch.float64),
                             torch.zeros((), dtype=torch.float64, device=self.device) if out_of_step is None
                             else out_of_step.to(self.device)])
        # One collective and one host sync for the whole check.
        bad_steps, steps, bad_weights, layers_out_of_step = comm.all_reduce(flags, "sum").tolist()
        if layers_out_of_step > 0:
            raise SyncBatchNormOutOfStepError(_out_of_step_message(self.model, where))
        failed = bad_weights > 0 or (bad_steps > 0 and (not self.skipped_steps_allowed or bad_steps >= steps))
        if not failed:
            self._reset()
            return
        firsts = [row for row in comm.all_gather_tensor(self.first.reshape(1, 3).cpu()) if row[0, 0] >= 0]
        raise NonFiniteError(_message(firsts, int(bad_steps), int(steps), where, context, _first_bad(weights)))


def _out_of_step_message(model: Optional[nn.Module], where: str) -> str:
    """The out-of-step error: this rank's first such layer (or, if only another rank's group has one, that)."""
    found = out_of_step_layers(model) if model is not None else []
    head = (out_of_step_message(found) if found else
            "SyncBatchNorm's ranks are out of step in another rank's group (its error names the layer).")
    return (f"training stopped: {head} Detected {where}. Stopped before writing any checkpoint: "
            "checkpoints/last.pt holds the weights from before it.")


def _first_bad(weights: Mapping[str, torch.Tensor]) -> str:
    """'name=value' of the first non-finite weight (weights are the same on every rank), or ''."""
    for name, tensor in weights.items():
        bad = tensor.detach()[~torch.isfinite(tensor.detach())]
        if bad.numel():
            return f"{name}={bad.flatten()[0].item()}"
    return ""


def _message(firsts: list[torch.Tensor], bad_steps: int, steps: int, where: str, context: str,
             bad_weight: str) -> str:
    if firsts:
        step, kind, value = min((tuple(r[0].tolist()) for r in firsts), key=lambda r: r[0])
        what = "loss" if kind == 1 else "gradient norm"
        head = f"training diverged: the {what} was {value} at optimizer step {int(step)}"
    else:
        head = f"training diverged: the weights are no longer finite ({bad_weight})"
    skipped = f" ({bad_steps} of the {steps} step(s) checked were non-finite)" if bad_steps else ""
    context = f" ({context})" if context else ""
    return (f"{head}{skipped}; detected {where}{context}. Stopped before writing any non-finite checkpoint: "
            f"checkpoints/last.pt holds the last finite weights. {CAUSES}")
