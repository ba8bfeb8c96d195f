"""Batch samplers: world-size-invariant training batches, exact (unpadded) evaluation shards and batches.

torch's DistributedSampler deals samples round-robin and pads the last shard with duplicates, so
neither the union of the ranks' micro-batches equals a one-process batch nor does evaluation see each
sample once. These samplers give both guarantees, and EvalBatchSampler also makes every evaluation batch
the same for any world size.
"""
from __future__ import annotations

from typing import Iterator, Sequence, Sized

import torch
from torch.utils.data import Sampler

from src.data.seeded import mix_seed


class TrainBatchSampler(Sampler[list[tuple[int, int]]]):
    """Yields this rank's micro-batches as lists of (epoch, index) pairs.

    Per epoch a permutation is drawn from (seed, epoch) alone; global batch k is perm[k*B:(k+1)*B] with
    B = world_size * batch_size, and rank r takes the contiguous slice [r*b:(r+1)*b]. Concatenating the
    ranks' micro-batches in rank order therefore gives exactly the one-process batch of size B.

    The epoch travels with every index: DataLoader workers are forked copies of the dataset, so a
    `set_epoch` on the main process's dataset would not reach them; indices always do.
    """

    def __init__(self, dataset_len: int, batch_size: int, rank: int = 0, world_size: int = 1, seed: int = 0,
                 shuffle: bool = True, drop_last: bool = True) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}")
        self.dataset_len = int(dataset_len)
        self.batch_size = int(batch_size)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.seed = int(seed)
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.epoch = 0
        self._start = 0
        if len(self) == 0:
            raise ValueError(
                f"the dataset has {self.dataset_len} samples, fewer than one global batch of "
                f"{self.global_batch_size} (world_size {world_size} x batch_size {batch_size}); "
                "lower data.batch_size or use more data")

    @property
    def global_batch_size(self) -> int:
        """B = world_size * batch_size."""
        return self.world_size * self.batch_size

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose permutation the next iteration uses."""
        self.epoch = int(epoch)

    def set_start(self, micro_batch_index: int) -> None:
        """Make the next iteration (only) begin at this micro-batch of the epoch: exact mid-epoch resume."""
        if not 0 <= micro_batch_index <= len(self):
            raise ValueError(f"micro_batch_index must be in [0, {len(self)}], got {micro_batch_index}")
        self._start = int(micro_batch_index)

    def permutation(self, epoch: int) -> torch.Tensor:
        """The dataset order of `epoch`: the same on every rank and for every world size."""
        if not self.shuffle:
            return torch.arange(self.dataset_len)
        g = torch.Generator()
        g.manual_seed(mix_seed(self.seed, epoch))
        return torch.randperm(self.dataset_len, generator=g)

    def __len__(self) -> int:
        """Micro-batches per epoch (the same on every rank)."""
        full, rest = divmod(self.dataset_len, self.global_batch_size)
        # A final partial batch is kept only if every rank gets at least one sample of it.
        return full + int(not self.drop_last and rest >= self.world_size)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        start, self._start = self._start, 0  # set_start applies to one iteration
        return self._batches(self.epoch, start)

    def _batches(self, epoch: int, start: int) -> Iterator[list[tuple[int, int]]]:
        perm = self.permutation(epoch).tolist()
        big, b, r, w = self.global_batch_size, self.batch_size, self.rank, self.world_size
        for k in range(start, len(self)):
            batch = perm[k * big:(k + 1) * big]
            if len(batch) == big:
                mine = batch[r * b:(r + 1) * b]
            else:  # the partial last batch (drop_last=False): contiguous near-equal slices, in rank order
                lo, hi = _shard_bounds(len(batch), r, w)
                mine = batch[lo:hi]
            yield [(epoch, i) for i in mine]


class ExactEvalSampler(Sampler[int]):
    """This rank's contiguous shard of range(dataset_len): uneven, no padding, every index exactly once."""

    def __init__(self, dataset_len: int | Sized, rank: int = 0, world_size: int = 1) -> None:
        if not isinstance(dataset_len, int):
            dataset_len = len(dataset_len)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}")
        self.start, self.stop = _shard_bounds(int(dataset_len), rank, world_size)

    def __len__(self) -> int:
        return self.stop - self.start

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.stop))


class EvalBatchSampler(Sampler[list[int]]):
    """This rank's evaluation batches: fixed blocks of dataset indices, whole blocks per rank, no padding.

    Block k is [k*B, (k+1)*B) with B = batch_size (the last block may be shorter); rank r takes a contiguous
    run of whole blocks (the first n_blocks % world_size ranks one more). Which images share a batch, and
    so its padding (detectors pad a batch to its largest image) and the batch shape that kernels are chosen
    by, is therefore the same for any world size; a per-rank shard cut into batches (ExactEvalSampler with a
    DataLoader batch_size) would move every batch boundary with the world size. Ranks concatenated in
    order visit 0..dataset_len-1 exactly once.
    """

    def __init__(self, dataset_len: int, batch_size: int, rank: int = 0, world_size: int = 1) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}")
        self.dataset_len = int(dataset_len)
        self.batch_size = int(batch_size)
        self.blocks = range(*_shard_bounds(-(-self.dataset_len // self.batch_size), rank, world_size))

    def __len__(self) -> int:
        return len(self.blocks)

    def __iter__(self) -> Iterator[list[int]]:
        b = self.batch_size
        return (list(range(k * b, min((k + 1) * b, self.dataset_len))) for k in self.blocks)


def _shard_bounds(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """[lo, hi) of rank's contiguous shard; the first n % world_size ranks hold one more."""
    base, extra = divmod(n, world_size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + int(rank < extra)


def check_each_index_once(indices: Sequence[int], expected: int | None, what: str, hint: str) -> None:
    """Raise RuntimeError unless `indices` (gathered from every rank) visit 0..expected-1 exactly once each.

    What ExactEvalSampler guarantees, checked where results are gathered: a padding sampler (or a shard
    lost on the way) would make metrics or predictions silently wrong. `expected` None checks duplicates only.
    """
    distinct = len(set(indices))
    if distinct != len(indices):
        raise RuntimeError(f"some {what} were processed on more than one rank ({len(indices)} results, {distinct} "
                           f"distinct): every one must be processed exactly once; {hint}")
    if expected is not None and len(indices) != expected:
        raise RuntimeError(f"{len(indices)} of {expected} {what} were processed across all ranks: every one must be "
                           f"processed exactly once; {hint}")
