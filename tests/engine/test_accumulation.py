"""Gradient accumulation: window arithmetic, one all-reduce per optimizer step (counted on real DDP),
and K micro-batches of b equal one batch of K*b with a batch-independent norm."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from src import comm
from src.config import TrainerConfig
from src.engine.accumulation import micro_step, optimizer_steps_per_epoch
from src.engine.checkpoint.state import TrainState
from src.engine.hooks import Hook
from src.engine.trainer import Trainer
from src.models import build_model
from src.models.config import ModelConfig, NormConfig
from src.precision import build_scaler
from src.tasks.classification import classification_loss
from tests.engine.fake_loader import ListLoader
from tests.support.gloo import run_on_ranks

# One intra-op thread, as on each gloo rank (put back after each test); tests here seed torch's global generator.
pytestmark = pytest.mark.usefixtures("one_thread", "restores_rng")


@pytest.mark.parametrize("n,k", [(7, 3), (6, 3), (5, 1), (2, 4)])
def test_windows_cover_the_epoch_and_scales_sum_to_one(n: int, k: int) -> None:
    steps = [micro_step(i, n, k) for i in range(n)]
    syncs = [s.index for s in steps if s.is_last_in_window]
    assert len(syncs) == optimizer_steps_per_epoch(n, k) == -(-n // k)
    assert syncs[-1] == n - 1  # the short last window still steps
    start = 0
    for end in syncs:  # every window's loss scales add up to 1: a mean over its real micro-batches
        assert sum(steps[i].loss_scale for i in range(start, end + 1)) == pytest.approx(1.0)
        start = end + 1


def test_short_last_window_is_scaled_by_its_real_size() -> None:
    last = micro_step(6, 7, 3)
    assert (last.window_size, last.loss_scale, last.is_last_in_window) == (1, 1.0, True)


def _data(total: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(total, 3, 8, 8, generator=g), torch.randint(0, 4, (total,), generator=g)


def _model() -> nn.Module:
    torch.manual_seed(0)
    # GroupNorm: the forward of a sample does not depend on the rest of its batch.
    return build_model(ModelConfig(name="resnet20"), NormConfig(name="gn", num_groups=4), num_classes=4)


def _trainer(model: nn.Module, batches: list, accum: int, module: nn.Module | None = None,
             lr: float = 0.1, epochs: int = 1, dtype: str = "float32", hooks: tuple = ()) -> Trainer:
    """A Trainer over `batches` each epoch (SGD with momentum, constant LR)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    state = TrainState(model, opt, sched, build_scaler("none", torch.device("cpu")))
    settings = TrainerConfig(epochs=epochs, grad_accum_steps=accum, progress_bar=False, dtype=dtype)
    return Trainer(state, module if module is not None else model, ListLoader(batches), classification_loss(),
                   settings, torch.device("cpu"), hooks=hooks)


class _GlobalLoss(Hook):
    """The mean loss of each optimizer step over every rank's samples (an all_reduce per step)."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def after_step(self, trainer: Trainer) -> None:
        out = trainer.last_step
        sums = comm.reduce_dict({"loss": float(out.loss_sum), "images": float(out.images)}, average=False)
        self.losses.append(sums["loss"] / sums["images"])


def _count_allreduces(rank: int, world: int, accum: int, micro_batches: int) -> dict:
    """Train one epoch under real DDP with a comm hook that counts, then delegates to allreduce_hook."""
    model = _model()
    ddp = DistributedDataParallel(model, bucket_cap_mb=1)
    rounds: list[list[int]] = []
    current: list[int] = []

    def counting_hook(state, bucket):
        current.append(bucket.index())
        if bucket.is_last():  # one round = the all-reduce of every gradient bucket of one backward
            rounds.append(sorted(current))
            current.clear()
        return allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, counting_hook)
    x, y = _data(micro_batches * 4 * world, seed=1)
    mine = [(x[i * 4 * world + rank * 4:][:4], y[i * 4 * world + rank * 4:][:4]) for i in range(micro_batches)]
    trainer = _trainer(model, mine, accum, module=ddp)
    trainer.train()
    return {"rounds": rounds, "leftover": list(current), "steps": trainer.state.progress.step,
            "param_sum": float(sum(p.detach().double().sum() for p in model.parameters()))}


@pytest.mark.parametrize("accum,micro_batches", [(3, 7), (1, 3)])
def test_one_gradient_allreduce_per_optimizer_step(accum: int, micro_batches: int) -> None:
    results = run_on_ranks(2, _count_allreduces, accum, micro_batches)
    expected_steps = optimizer_steps_per_epoch(micro_batches, accum)
    for r in results:
        assert r["steps"] == expected_steps
        assert len(r["rounds"]) == expected_steps, f"{len(r['rounds'])} gradient all-reduces for {expected_steps} steps"
        assert not r["leftover"]
        for buckets in r["rounds"]:  # each round reduced every bucket exactly once (DDP may re-bucket after round 1)
            assert buckets == list(range(len(buckets)))
    assert results[0]["param_sum"] == results[1]["param_sum"]  # replicas stayed identical


def test_accumulated_micro_batches_equal_one_big_batch() -> None:
    """K=4 micro-batches of 4 give the parameters of one batch of 16, step after step (3 steps, SGD momentum).

    Tolerance 2e-5 absolute on parameters of magnitude ~0.1-1: the two runs sum the same fp32 terms in a
    different order (4 partial means vs one mean), a relative rounding of ~1e-7 per operation, which
    three momentum steps at lr 0.1 amplify to ~1e-6; a wrong scale (e.g. 1/K missing) moves them by >1e-2.
    """
    x, y = _data(48)
    big = _model()
    small = copy.deepcopy(big)
    _trainer(big, [(x[i:i + 16], y[i:i + 16]) for i in range(0, 48, 16)], accum=1).train()
    _trainer(small, [(x[i:i + 4], y[i:i + 4]) for i in range(0, 48, 4)], accum=4).train()
    moved = max((p - q).abs().max().item() for p, q in zip(big.parameters(), _model().parameters()))
    diff = max((p - q).abs().max().item() for p, q in zip(big.parameters(), small.parameters()))
    assert moved > 1e-2, "training did not move the parameters: the comparison would be vacuous"
    assert diff < 2e-5, f"accumulated and big-batch parameters differ by {diff}"


def test_partial_window_averages_over_its_own_micro_batches() -> None:
    """An epoch of 5 micro-batches with K=4: the last step must equal a plain step on the 5th micro-batch."""
    x, y = _data(20)
    batches = [(x[i:i + 4], y[i:i + 4]) for i in range(0, 20, 4)]
    model = _model()
    reference = copy.deepcopy(model)
    trained = _trainer(model, batches, accum=4)
    trained.train()
    assert trained.state.progress.step == 2  # a window of 4, then one of 1
    first = _trainer(reference, batches[:4], accum=4)
    first.train()
    # The reference's second step: a one-micro-batch window on the 5th, with its own momentum buffers.
    second = Trainer(first.state, reference, ListLoader(batches[4:]), classification_loss(),
                     TrainerConfig(epochs=2, grad_accum_steps=1, progress_bar=False), torch.device("cpu"))
    second.train()
    assert second.state.progress.step == 2
    diff = max((p - q).abs().max().item() for p, q in zip(model.parameters(), reference.parameters()))
    assert diff < 1e-6


# 7 micro-batches of 4 per rank and epoch, K=4: windows of 4 and 3 (the partial last one), 3 epochs.
ACCUM_MICRO, ACCUM_EPOCHS, MICRO = 7, 3, 4


def _accumulate_float64(rank: int, world: int) -> dict:
    """K=4 accumulation under real DDP (no_sync for the first micro-batches of a window), in float64."""
    model = _model().double()
    x, y = _data(ACCUM_MICRO * MICRO * world, seed=2)
    step = MICRO * world  # micro-batch i of rank r: x[i*step + r*MICRO:][:MICRO]
    mine = [(x[i * step + rank * MICRO:][:MICRO], y[i * step + rank * MICRO:][:MICRO]) for i in range(ACCUM_MICRO)]
    losses = _GlobalLoss()
    _trainer(model, mine, accum=4, module=DistributedDataParallel(model), epochs=ACCUM_EPOCHS, dtype="float64",
             hooks=(losses,)).train()
    return {"losses": losses.losses, "params": {k: v.numpy().copy() for k, v in model.state_dict().items()}}


def test_float64_accumulation_on_two_ranks_equals_one_batch_per_window() -> None:
    """2 ranks x K=4 micro-batches of 4 == one process with one micro-batch of 32 per window, and the partial
    window of 3 == one micro-batch of 24: per-step losses and final parameters to 1e-9 relative.

    float64 with GroupNorm (no cross-sample statistics): the runs differ only by the order of float64 sums
    (4 partial means and a two-way DDP average vs one mean), ~1e-16 relative per operation; measured worst
    over the 6 steps (AMD EPYC, 2026-12-01): losses 3e-16, parameters 4e-15. Scaling the partial window by
    1/K instead of 1/3 (the classic accumulation bug) makes them differ by 0.5 and 0.7.
    """
    ranks = run_on_ranks(2, _accumulate_float64)
    world = 2
    x, y = _data(ACCUM_MICRO * MICRO * world, seed=2)
    per = MICRO * world
    windows = [(0, 4), (4, 7)]
    reference = _model().double()
    losses = _GlobalLoss()
    _trainer(reference, [(x[a * per:b * per], y[a * per:b * per]) for a, b in windows], accum=1,
             epochs=ACCUM_EPOCHS, dtype="float64", hooks=(losses,)).train()
    assert len(losses.losses) == len(ranks[0]["losses"]) == 2 * ACCUM_EPOCHS
    for result in ranks:
        worst_loss = max(abs(a - b) / abs(b) for a, b in zip(result["losses"], losses.losses))
        assert worst_loss < 1e-9, f"per-step losses differ by up to {worst_loss:.3g} relative"
        ref = reference.state_dict()
        worst = max(((torch.from_numpy(result["params"][k]) - ref[k]).abs().max() / ref[k].abs().max()).item()
                    for k in ref if ref[k].is_floating_point() and ref[k].abs().max() > 0)
        assert worst < 1e-9, f"final parameters differ by up to {worst:.3g} relative"
    moved = max((a - b).abs().max().item() for a, b in zip(reference.parameters(), _model().double().parameters()))
    assert moved > 1e-2, "training did not move the parameters: the comparison would be vacuous"
