"""A DataLoader whose worker processes end when the code that built it says so, not when garbage collection gets
to its iterators.

torch ends a loader iterator's workers when the iterator is exhausted or freed. A loop left by an exception
(a corrupt image in a worker, a failed step, a collective's timeout) leaves its iterator alive in the
exception's traceback, and a worker's error is a reference cycle (torch re-raises it from a frame that refers
to it), so only the cyclic garbage collector frees that iterator. At interpreter exit that comes after
multiprocessing's exit handler, which SIGTERMs the loader workers and waits for them; training's workers ignore
SIGTERM (src/engine/preemption.py: the trainer decides when to stop), so the run printed its error and then
waited forever. Whoever builds a loader closes it in a `finally` (the commands do): every live iterator's
workers are told to stop and joined, at once, whatever the way out.
"""
from __future__ import annotations

import weakref
from typing import Any, Iterator

from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter


class ClosableLoader(DataLoader):
    """torch's DataLoader, plus `close()`: end the worker processes of every iterator it has handed out."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._live: weakref.WeakSet = weakref.WeakSet()  # iterators with worker processes (one when persistent)

    def __iter__(self) -> Iterator[Any]:
        iterator = super().__iter__()
        if isinstance(iterator, _MultiProcessingDataLoaderIter):
            self._live.add(iterator)
        return iterator

    def close(self) -> None:
        """Stop and join the workers of every iterator still alive (persistent ones too); iterating again starts
        new ones."""
        for iterator in list(self._live):
            # torch has no public call for this; it is what the iterator's __del__ does (and PyTorch
            # Lightning calls it too when a fit ends).
            iterator._shutdown_workers()
        self._live = weakref.WeakSet()
        self._iterator = None  # persistent_workers: the next iter() starts fresh workers


def close_loaders(*loaders: Any) -> None:
    """close() each loader that has one (ClosableLoader); others (lists, plain DataLoaders in tests) are skipped."""
    for loader in loaders:
        close = getattr(loader, "close", None)
        if callable(close):
            close()
