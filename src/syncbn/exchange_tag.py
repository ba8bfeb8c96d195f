"""What identifies a layer's exchange, and the check that the group's ranks exchanged the same call.

Collectives pair up by order alone: a rank that skips an exchange (one training step with the layer in eval
mode, `configure_sync` on that rank only, a layer skipped by a branch) pairs its next one with a peer's earlier
one, and the merged statistics are silently wrong (the payload sizes match whenever the widths do). So each
layer's exchange carries its identity, [calls, index]:
- calls: the layer's calls that a training step makes, counted the same on every rank that runs the same steps:
  every training-mode forward (synchronised or local: sync_every's and sync_until_step's local forwards count,
  an activation checkpoint's replay does not), and every eval-mode forward that a backward then runs through
  (counted by a hook on its output, when the gradient arrives). Forwards under torch.no_grad in eval mode, i.e.
  evaluation (on any ranks, any number of batches), and eval-mode forwards nothing backpropagates through, do
  not count.
- index: the layer's position among the model's SyncBatchNorm layers (out_of_step.number_layers, called by
  convert_sync_batchnorm), 0 for a layer never numbered.

The check is folded into the first all_reduce, with no host read and no branch on device data: each rank adds
[c, i, c², i²] (c, i modulo M) to it; after it, rank r has the group's sums and compares them with W times its
own. Σc = W·c_r and Σc² = W·c_r² together mean the group's mean of c is c_r and its variance 0, i.e. every rank
sent c_r (the same for i): so every rank reaches the same verdict from the same sums, also at W > 2. All of it is
integer arithmetic in float64, exact while W·M² < 2^53 (`_modulus`); the all_gather exchange compares the rows'
identities directly. A rank that disagrees sets its mean sums to NaN, so the step's mean, variance, output,
gradients and running statistics are NaN on every rank of the group, and the layer keeps the identity of the first
call at which that happened (`first_out_of_step`) for out_of_step.py to name it.
"""
from __future__ import annotations

import contextlib
import math

import torch

# Values the check adds to the first all_reduce ([c, i, c², i²]) and to each row of the all_gather ([c, i]).
REDUCE_VALUES = 4
GATHER_VALUES = 2


class ExchangeTag:
    """A layer's exchange identity on one device: `identity` = [calls, index] (float64, exact integers) and
    `first_out_of_step`, the identity of the call whose exchange first found the group out of step ([inf, inf]:
    never)."""

    __slots__ = ("identity", "first_out_of_step", "_one_call")

    def __init__(self, device: torch.device, index: int) -> None:
        with _normal_tensors():
            self.identity = torch.tensor([0.0, float(index)], dtype=torch.float64, device=device)
            self.first_out_of_step = torch.full((2,), math.inf, dtype=torch.float64, device=device)
            self._one_call = torch.tensor([1.0, 0.0], dtype=torch.float64, device=device)
        if device.type != "meta":
            _mark_static(self.identity, self.first_out_of_step)

    @property
    def device(self) -> torch.device:
        """Where the tag's tensors live."""
        return self.identity.device

    def moved_to(self, device: torch.device, index: int) -> "ExchangeTag":
        """This tag on `device` (itself if already there); from the meta device (no values) a new one for `index`."""
        if self.device == device:
            return self
        if self.device.type == "meta":
            return ExchangeTag(device, index)
        moved = ExchangeTag.__new__(ExchangeTag)
        with _normal_tensors():
            moved.identity, moved.first_out_of_step, moved._one_call = (
                t.to(device) for t in (self.identity, self.first_out_of_step, self._one_call))
        _mark_static(moved.identity, moved.first_out_of_step)
        return moved

    def set_index(self, index: int) -> None:
        """Set the layer index it carries (outside a training step: a host-to-device write)."""
        self.identity[1] = float(index)

    def count_call(self) -> None:
        """One more call (on the device)."""
        self.identity.add_(self._one_call)

    def count_backward(self, grad: torch.Tensor) -> None:
        """A tensor hook: an eval-mode forward's output got its gradient, so that forward was a training step's."""
        self.count_call()


def _normal_tensors() -> contextlib.AbstractContextManager:
    # Made inside torch.inference_mode they would be inference tensors, which no later training step may update.
    return torch.inference_mode(False) if torch.is_inference_mode_enabled() else contextlib.nullcontext()


def _mark_static(*tensors: torch.Tensor) -> None:
    # Compiled graphs mutate these in place: marked static like a buffer, so that CUDA graphs still capture the
    # graph (a mutated input that is not static makes Inductor skip them). Eager only: it is not traceable.
    if not torch.compiler.is_compiling():
        for t in tensors:
            torch._dynamo.mark_static_address(t, guard=False)


def _modulus(world_size: int) -> float:
    """The power of 2 M with world_size · M² < 2^53: a sum of W squares below M² is exact in float64."""
    return float(2 ** ((53 - world_size.bit_length()) // 2))


def reduce_payload(identity: torch.Tensor, world_size: int, mean_sums: torch.Tensor) -> torch.Tensor:
    """The first all_reduce's payload: [c, i, c², i²] (modulo M), then this rank's [n, n·mean] (C+1 values)."""
    wrapped = torch.remainder(identity, _modulus(world_size))
    return torch.cat([wrapped, wrapped * wrapped, mean_sums])


def checked_mean_sums(reduced: torch.Tensor, payload: torch.Tensor, world_size: int, identity: torch.Tensor,
                      first_out_of_step: torch.Tensor) -> torch.Tensor:
    """The group's [N, Σ n·mean] from the all-reduced payload, its Σ n·mean NaN when the ranks disagree."""
    # Over the whole payload (C + 5 values) and then the identity's part: one view fewer than slicing both first.
    out_of_step = torch.sub(reduced, payload, alpha=world_size)[:REDUCE_VALUES].any()
    # Σ n·mean only: the counts stay, the kernels check them (and NaN there would not reach the variance).
    reduced[REDUCE_VALUES + 1:].masked_fill_(out_of_step, math.nan)
    _remember(first_out_of_step, identity, out_of_step)
    return reduced[REDUCE_VALUES:]


def gather_row(identity: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
    """This rank's row for the all_gather: [n, mean, M2] (2C+1 values), then [calls, index]."""
    return torch.cat([stats, identity])


def checked_rows(gathered: torch.Tensor, identity: torch.Tensor, first_out_of_step: torch.Tensor) -> torch.Tensor:
    """The gathered [W, 2C+1] rows without their identities, the means NaN when the rows' identities differ."""
    out_of_step = (gathered[:, -GATHER_VALUES:] != identity).any()
    rows = gathered[:, :-GATHER_VALUES].contiguous()
    channels = (rows.shape[1] - 1) // 2
    rows[:, 1:1 + channels].masked_fill_(out_of_step, math.nan)
    _remember(first_out_of_step, identity, out_of_step)
    return rows


def _remember(first_out_of_step: torch.Tensor, identity: torch.Tensor, out_of_step: torch.Tensor) -> None:
    # identity / True = identity, identity / False = inf (calls >= 1 here): fmin keeps the first out-of-step call.
    torch.fmin(first_out_of_step, identity / out_of_step, out=first_out_of_step)
