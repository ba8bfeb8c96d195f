"""TrainBatchSampler, ExactEvalSampler and EvalBatchSampler: the properties distributed training and evaluation rely on."""
from __future__ import annotations

import itertools

import pytest

from src.data.samplers import EvalBatchSampler, ExactEvalSampler, TrainBatchSampler


def _indices(batches: list[list[tuple[int, int]]]) -> list[list[int]]:
    return [[i for _, i in b] for b in batches]


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("drop_last", [True, False])
def test_ranks_concatenate_to_the_one_process_batch(world_size: int, drop_last: bool) -> None:
    n, b, seed = 103, 4, 7
    reference = TrainBatchSampler(n, world_size * b, rank=0, world_size=1, seed=seed, drop_last=drop_last)
    samplers = [TrainBatchSampler(n, b, rank=r, world_size=world_size, seed=seed, drop_last=drop_last)
                for r in range(world_size)]
    for epoch in (0, 1, 5):
        reference.set_epoch(epoch)
        for s in samplers:
            s.set_epoch(epoch)
        per_rank = [_indices(list(s)) for s in samplers]
        expected = _indices(list(reference))
        if not drop_last and len(per_rank[0]) < len(expected):
            expected = expected[:len(per_rank[0])]  # a last batch too small to give every rank a sample
        assert len({len(p) for p in per_rank}) == 1, "every rank must get the same number of micro-batches"
        assert len(per_rank[0]) == len(samplers[0])
        got = [list(itertools.chain(*(p[k] for p in per_rank))) for k in range(len(per_rank[0]))]
        assert got == expected
        if drop_last:
            assert all(len(m) == b for p in per_rank for m in p)


def test_epoch_is_carried_and_changes_the_order() -> None:
    s = TrainBatchSampler(64, 8, seed=1)
    s.set_epoch(3)
    batches = list(s)
    assert {e for b in batches for e, _ in b} == {3}
    order3 = _indices(batches)
    s.set_epoch(4)
    assert _indices(list(s)) != order3
    s.set_epoch(3)
    assert _indices(list(s)) == order3
    assert sorted(i for b in order3 for i in b) == list(range(64))
    assert _indices(list(TrainBatchSampler(64, 8, seed=2))) != _indices(list(TrainBatchSampler(64, 8, seed=1)))


@pytest.mark.parametrize("world_size", [1, 3])
def test_set_start_resumes_exactly(world_size: int) -> None:
    s = TrainBatchSampler(100, 5, rank=world_size - 1, world_size=world_size, seed=0)
    s.set_epoch(2)
    full = list(s)
    for start in (0, 1, len(full) - 1, len(full)):
        s.set_start(start)
        assert list(s) == full[start:]
    assert list(s) == full, "set_start applies to one iteration only"
    with pytest.raises(ValueError, match="micro_batch_index"):
        s.set_start(len(full) + 1)


def test_too_small_dataset_is_an_error() -> None:
    with pytest.raises(ValueError, match="fewer than one global batch"):
        TrainBatchSampler(7, 4, rank=0, world_size=2)


@pytest.mark.parametrize("n", [0, 1, 2, 5, 97, 100])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_eval_shards_cover_each_index_once(n: int, world_size: int) -> None:
    shards = [list(ExactEvalSampler(n, r, world_size)) for r in range(world_size)]
    assert list(itertools.chain(*shards)) == list(range(n)), "contiguous, in order, no padding, no duplicates"
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == [len(ExactEvalSampler(n, r, world_size)) for r in range(world_size)]


@pytest.mark.parametrize("n", [0, 1, 5, 7, 97])
@pytest.mark.parametrize("batch_size", [1, 2, 8])
def test_eval_batches_are_the_same_blocks_for_any_world_size(n: int, batch_size: int) -> None:
    blocks = [list(range(k, min(k + batch_size, n))) for k in range(0, n, batch_size)]
    for world_size in (1, 2, 3, 4):
        per_rank = [list(EvalBatchSampler(n, batch_size, r, world_size)) for r in range(world_size)]
        assert list(itertools.chain(*per_rank)) == blocks, "whole blocks, contiguous runs in rank order, no padding"
        counts = [len(batches) for batches in per_rank]
        assert max(counts) - min(counts) <= 1
        assert counts == [len(EvalBatchSampler(n, batch_size, r, world_size)) for r in range(world_size)]


def test_eval_batch_sampler_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        EvalBatchSampler(5, 0)
    with pytest.raises(ValueError, match="rank must be in"):
        EvalBatchSampler(5, 2, rank=2, world_size=2)
