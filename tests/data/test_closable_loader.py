"""ClosableLoader.close(): the loader workers end when the code that built the loader says so, also while an
exception (which holds the loader's iterator in its traceback) is still alive."""
from __future__ import annotations

import gc
import multiprocessing

import pytest
from torch.utils.data import DataLoader, Dataset

from src.data import ClosableLoader


class _FailsAt(Dataset):
    """Ten numbers; reading sample `bad` raises, as a corrupt file does."""

    def __init__(self, bad: int | None = None) -> None:
        self.bad = bad

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> int:
        if index == self.bad:
            raise OSError(f"sample {index} is broken")
        return index


def _fail_holding_the_error(loader: DataLoader) -> tuple[pytest.ExceptionInfo, list]:
    """Iterate until the worker's error; return it (still alive, as in a run's error path) and the new children."""
    before = set(multiprocessing.active_children())
    with pytest.raises(OSError, match="sample 3 is broken") as info:
        for _ in loader:
            pass
    return info, [p for p in multiprocessing.active_children() if p not in before]


def test_an_error_keeps_the_workers_alive_until_close() -> None:
    # The cause of runs that printed their error and never exited: torch ends an iterator's workers when the
    # iterator is freed, and a worker's error holds the iterator (in a reference cycle) as long as it lives.
    plain = DataLoader(_FailsAt(3), batch_size=2, num_workers=2)
    error, workers = _fail_holding_the_error(plain)
    assert len(workers) == 2 and all(w.is_alive() for w in workers)
    del error
    assert all(w.is_alive() for w in workers), "freed by reference counting after all: the module's reason is wrong"
    gc.collect()  # only the cyclic collector frees them: at interpreter exit, after multiprocessing waited for them
    assert not any(w.is_alive() for w in workers)

    loader = ClosableLoader(_FailsAt(3), batch_size=2, num_workers=2)
    error, workers = _fail_holding_the_error(loader)
    assert len(workers) == 2
    loader.close()
    assert not any(w.is_alive() for w in workers), "close() left loader workers running"
    assert error.value is not None  # the error is still held: close() did not depend on freeing it


def test_close_ends_persistent_workers_and_the_loader_still_works() -> None:
    loader = ClosableLoader(_FailsAt(), batch_size=5, num_workers=2, persistent_workers=True)
    before = set(multiprocessing.active_children())
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    workers = [p for p in multiprocessing.active_children() if p not in before]
    assert len(workers) == 2 and all(w.is_alive() for w in workers)  # persistent: they wait for the next epoch
    loader.close()
    assert not any(w.is_alive() for w in workers)
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]  # new workers
    loader.close()
