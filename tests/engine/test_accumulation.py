"""Gradient accumulation: window arithmetic, one all-reduce per optimizer step (counted on real DDP),
and K micro-batches of b equal one batch of K*b with a batch-independent norm."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from src.config import TrainerConfig
from src.engine.accumulation import micro_step, optimizer_steps_per_epoch
from src.engine.amp import build_scaler
from src.engine.losses import classification_loss
from src.engine.state import TrainState
from src.engine.trainer import Trainer
from src.models import build_model
from src.models.config import ModelConfig, NormConfig
from tests.engine.fake_loader import ListLoader
from tests.engine.gloo_ranks import run_ranks


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
             lr: float = 0.1) -> Trainer:
    """A one-epoch Trainer over `batches` (SGD with momentum, constant LR, no hooks)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    state = TrainState(model, opt, sched, build_scaler("none", torch.device("cpu")))
    settings = TrainerConfig(epochs=1, grad_accum_steps=accum, progress_bar=False)
    return Trainer(state, module if module is not None else model, ListLoader(batches), classification_loss(),
                   settings, torch.device("cpu"))


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
    results = run_ranks(_count_allreduces, 2, accum, micro_batches)
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
    torch.set_num_threads(1)
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
    torch.set_num_threads(1)
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
