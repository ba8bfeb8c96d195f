"""Datasets on disk under 2 real gloo processes: loading is guarded, missing data fails on every rank."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.data.fake_cifar10 import write_fake_cifar10
from tests.support.gloo import run_on_ranks
from src.config import data_config


def _build_both(rank: int, world: int, absent: str, present: str,
                lists: dict[str, Any]) -> tuple[tuple[str, str], tuple[int, int, list[int]]]:
    """Missing data first (the error on each rank), then the tiny files (what each rank loads)."""
    from torchvision import datasets

    from src.data import DataConfig
    from tests.support.task_data import build_datasets, build_train_loader

    try:
        build_datasets(data_config(name="cifar10", root=absent), seed=0)
        missing = ("none", "")
    except Exception as exc:  # the test inspects what each rank raised
        missing = (type(exc).__name__, str(exc))
    saved = {attr: getattr(datasets.CIFAR10, attr) for attr in lists}
    try:
        for attr, value in lists.items():  # this process's torchvision checksums -> the tiny files
            setattr(datasets.CIFAR10, attr, value)
        cfg = data_config(name="cifar10", root=present, batch_size=2)
        bundle = build_datasets(cfg, seed=0)
        _, labels, _ = next(iter(build_train_loader(bundle.train, cfg, rank, world, seed=0)))
    finally:  # the worker runs later tests' tasks too
        for attr, value in saved.items():
            setattr(datasets.CIFAR10, attr, value)
    return missing, (len(bundle.train), len(bundle.val), labels.tolist())


def test_guarded_loading_on_two_processes(tmp_path: Path) -> None:
    """One task for both cases."""
    lists = write_fake_cifar10(tmp_path / "present")
    results = run_on_ranks(2, _build_both, str(tmp_path / "absent"), str(tmp_path / "present"), lists)
    (kind0, msg0), (kind1, msg1) = results[0][0], results[1][0]
    assert kind0 == "MissingFileError" and "cifar-10-batches-py" in msg0 and "data.download=true" in msg0
    # The waiting rank does not hang at the barrier: it raises local rank 0's mistake, the same message (printed
    # once: src/commands/user_errors.py).
    assert kind1 == "UserError" and msg1 == msg0
    (n0, v0, l0), (n1, v1, l1) = results[0][1], results[1][1]
    assert (n0, v0) == (n1, v1) == (20, 4)
    assert len(l0) == len(l1) == 2
