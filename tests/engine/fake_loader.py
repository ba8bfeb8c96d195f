"""A list of micro-batches that behaves like the trainer's loader (TrainBatchSampler inside a DataLoader)."""
from __future__ import annotations

import torch

from src.data.batch import Batch


class ListLoader:
    """len = the whole epoch; `batch_sampler.set_start(k)` makes the next pass begin at micro-batch k
    (as TrainBatchSampler does on resume); set_epoch is accepted and changes nothing."""

    def __init__(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        # As the loader yields them: Batches, each sample numbered in its micro-batch.
        self.batches = [Batch(x, y, torch.arange(len(x))) for x, y in batches]
        self._start = 0
        self.batch_sampler, self.dataset = self, None

    def set_epoch(self, epoch: int) -> None:
        """The batches are the same in every epoch."""

    def set_start(self, start: int) -> None:
        """Begin the next pass at micro-batch `start`."""
        self._start = start

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        start, self._start = self._start, 0
        return iter(self.batches[start:])
