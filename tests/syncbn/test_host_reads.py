"""A SyncBN training step never reads a device value on the host, on 2 and 3 real gloo ranks.

On a GPU every such read (.item(), bool(tensor), a data-dependent branch) makes the host wait for the device, so
it can no longer queue work ahead of it. The CPU has no such wait, but the same Python code runs, so it is counted
here (tests/syncbn/host_reads.py: aten._local_scalar_dense and the other reading operators, operators tagged
cudagraph_unsafe, and every tensor-to-Python conversion) around forward + backward of a SyncBatchNorm2d alone and of
a small model under DDP, in every sync mode: synchronised every step, sync_every=2, sync_until_step=1,
group_size (a group of every rank), activation checkpointing's recomputation; eagerly, and compiled with
fullgraph=True where the trainer allows compile (the default and group_size: config validation refuses compile
with the others). Compiling happens before the counted steps.

The control: a rank whose input holds one value per channel must read the global count (F.batch_norm's "more than
1 value" error needs it on the host; docs/syncbn.md), eager and compiled; so the counter sees reads made inside
an operator, and the zeros above mean something.
"""
from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

from src.syncbn import SyncBatchNorm1d, SyncBatchNorm2d, configure_sync, create_rank_groups, set_optimizer_step
from tests.support.gloo import run_on_ranks
from tests.syncbn.host_reads import host_reads

# Compiling on W ranks at once takes a minute on 2 cores: part of make test, not the make test-fast loop.
pytestmark = pytest.mark.slow

STEPS = 3
# name -> configure_sync arguments ("world": this world's size), activation checkpointing, compiled too
MODES = {
    "every_step": ({}, False, True),
    "sync_every_2": ({"sync_every": 2}, False, False),
    "sync_until_step_1": ({"sync_until_step": 1}, False, False),
    "group_size": ({"group_size": "world"}, False, True),
    "recompute": ({}, True, False),
}


class Net(nn.Module):
    """conv-SyncBN-ReLU twice (the second block optionally checkpointed), pooled, linear-SyncBN1d, linear."""

    def __init__(self, checkpointed: bool) -> None:
        super().__init__()
        self.checkpointed = checkpointed
        self.stem = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), SyncBatchNorm2d(4), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), SyncBatchNorm2d(4), nn.ReLU())
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 6), SyncBatchNorm1d(6),
                                  nn.ReLU(), nn.Linear(6, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = checkpoint(self.block, x, use_reentrant=False) if self.checkpointed else self.block(x)
        return self.head(x)


def _counted_steps(module: nn.Module, model: nn.Module, batches: list, loss: Any, warm_up: bool) -> list[str]:
    """Host reads over forward + backward of every batch (after one uncounted step when warm_up: compiling)."""
    if warm_up:
        loss(module(batches[0][0]), batches[0][1]).backward()
    with host_reads() as reads:
        for step, (x, target) in enumerate(batches):
            loss(module(x), target).backward()
            set_optimizer_step(model, step + 1)  # what the trainer does after each optimizer step
    return reads


def _rank(rank: int, world: int, payload: dict) -> dict[str, list[str]]:
    gen = torch.Generator().manual_seed(rank)
    batches = [(torch.randn(3 + rank, 3, 6, 6, generator=gen), torch.randint(0, 3, (3 + rank,), generator=gen))
               for _ in range(STEPS)]
    create_rank_groups(world)  # group_size=world: every rank's group, created before any forward
    reads: dict[str, list[str]] = {}
    for name, (sync, checkpointed, compiled_too) in MODES.items():
        sync = {k: (world if v == "world" else v) for k, v in sync.items()}
        for compiled in (False, True) if compiled_too else (False,):
            torch._dynamo.reset()
            torch.manual_seed(0)
            model = Net(checkpointed)
            configure_sync(model, **sync)
            inner = torch.compile(model, fullgraph=True, backend="aot_eager") if compiled else model
            label = f"{name}{'-compiled' if compiled else ''}"
            reads[f"model-{label}"] = _counted_steps(DDP(inner), model, batches, F.cross_entropy, compiled)
            layer = SyncBatchNorm2d(3)
            configure_sync(layer, **sync)
            run = torch.compile(layer, fullgraph=True, backend="aot_eager") if compiled else layer
            xs = [(x.clone().requires_grad_(), None) for x, _ in batches]
            reads[f"layer-{label}"] = _counted_steps(run, layer, xs, lambda y, _: (y * y).sum(), compiled)
    # The control: one value per channel on this rank (the group holds `world`): the check reads the global count.
    for compiled in (False, True):
        torch._dynamo.reset()
        layer = SyncBatchNorm1d(3)
        run = torch.compile(layer, fullgraph=True, backend="aot_eager") if compiled else layer
        xs = [(torch.randn(1, 3, requires_grad=True), None) for _ in range(STEPS)]
        reads[f"one-value{'-compiled' if compiled else ''}"] = _counted_steps(
            run, layer, xs, lambda y, _: y.sum(), compiled)
    return reads


@pytest.fixture(scope="module", params=[2, 3], ids=lambda w: f"W{w}")
def ranks(request: pytest.FixtureRequest) -> tuple[int, list[dict[str, list[str]]]]:
    world = request.param
    return world, run_on_ranks(world, _rank, {}, deadline_s=600.0)


CHECKED = [f"{part}-{name}{suffix}" for name, (_, _, compiled_too) in MODES.items() for part in ("model", "layer")
           for suffix in (("", "-compiled") if compiled_too else ("",))]


@pytest.mark.parametrize("what", CHECKED)
def test_training_step_reads_nothing_on_the_host(ranks: tuple, what: str) -> None:
    world, results = ranks
    for rank, reads in enumerate(results):
        assert reads[what] == [], f"{what}, rank {rank} of {world}: {len(reads[what])} host reads: {reads[what][:6]}"


def test_the_counter_sees_the_one_value_check(ranks: tuple) -> None:
    world, results = ranks
    for rank, reads in enumerate(results):
        for what in ("one-value", "one-value-compiled"):
            # The check's operator once per forward, and the global count it reads (Tensor.item) inside; nothing else.
            ops = [r for r in reads[what] if r.startswith("synctrain.require_more_than_one_value")]
            assert len(ops) == STEPS, (what, rank, reads[what])
            assert all("require_more_than_one_value" in r for r in reads[what]), (what, rank, reads[what])
