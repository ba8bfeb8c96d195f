"""torch.autograd.gradcheck of the SyncBN Function in float64, on one process and across 2 processes."""
from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from src.syncbn.functions import sync_batch_norm
from tests.support.gloo import run_on_ranks

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def _bn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, group: Any = None, world: int = 1) -> torch.Tensor:
    return sync_batch_norm(x, w, b, None, None, None, 0.1, 1e-5, group, world)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape,fmt", [
    ((4, 3), torch.contiguous_format), ((3, 2, 5), torch.contiguous_format),
    ((2, 3, 2, 3), torch.contiguous_format), ((2, 3, 2, 3), torch.channels_last),
    ((2, 2, 2, 2, 3), torch.channels_last_3d),
])
def test_gradcheck_one_process(shape: tuple, fmt: torch.memory_format, device: str) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen, dtype=torch.float64).to(device).contiguous(memory_format=fmt).requires_grad_()
    w = (torch.rand(shape[1], generator=gen, dtype=torch.float64) + 0.5).to(device).requires_grad_()
    b = torch.randn(shape[1], generator=gen, dtype=torch.float64).to(device).requires_grad_()
    assert torch.autograd.gradcheck(_bn, (x, w, b))


class _MySlice(torch.autograd.Function):
    """Rows [start, stop) of the full batch; backward assembles every rank's input grad (all_reduce)."""

    @staticmethod
    def forward(ctx: Any, full: torch.Tensor, start: int, stop: int) -> torch.Tensor:  # type: ignore[override]
        ctx.shape, ctx.start, ctx.stop = full.shape, start, stop
        return full[start:stop].clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:  # type: ignore[override]
        full = grad.new_zeros(ctx.shape)
        full[ctx.start:ctx.stop] = grad
        dist.all_reduce(full)
        return full, None, None


class _GatherRows(torch.autograd.Function):
    """The full output from every rank's rows; gradcheck's output grads are identical on every rank."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, start: int, total: int) -> torch.Tensor:  # type: ignore[override]
        ctx.start, ctx.stop = start, start + local.shape[0]
        full = local.new_zeros((total,) + tuple(local.shape[1:]))
        full[ctx.start:ctx.stop] = local
        dist.all_reduce(full)
        return full

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:  # type: ignore[override]
        return grad[ctx.start:ctx.stop], None, None


class _SumGrad(torch.autograd.Function):
    """Identity whose backward sums the ranks' local parameter grads (what DDP does, without the mean)."""

    @staticmethod
    def forward(ctx: Any, p: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return p.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


def run_gradcheck(rank: int, world: int, payload: dict) -> bool:
    """Child: gradcheck of full batch -> (this rank's rows -> SyncBN over the group) -> full output.

    Every rank runs the identical gradcheck in lockstep, so the perturbed full input is the same on
    all ranks and the numerical Jacobian is the Jacobian of the distributed layer as a whole.
    """
    device, sizes = payload["device"], payload["sizes"]
    start, stop = sum(sizes[:rank]), sum(sizes[: rank + 1])
    x, w, b = (t.to(device).requires_grad_() for t in payload["inputs"])

    def f(full: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        local = _MySlice.apply(full, start, stop)
        y = _bn(local, _SumGrad.apply(w), _SumGrad.apply(b), dist.group.WORLD.group_name, world)
        return _GatherRows.apply(y, start, full.shape[0])

    return torch.autograd.gradcheck(f, (x, w, b))


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_across_two_processes(device: str) -> None:
    gen = torch.Generator().manual_seed(1)
    sizes = [2, 1]  # uneven split of a (3, 2, 3) batch
    inputs = [torch.randn(3, 2, 3, generator=gen, dtype=torch.float64),
              torch.rand(2, generator=gen, dtype=torch.float64) + 0.5, torch.randn(2, generator=gen, dtype=torch.float64)]
    assert run_on_ranks(2, run_gradcheck, {"device": device, "sizes": sizes, "inputs": inputs}) == [True, True]
