"""Checkpoint files: atomic writes, `last.pt` plus best-k, loading with weights_only=True.

What a checkpoint holds is defined by src/engine/checkpoint/state.py (TrainState.state_dict); this module only
moves such dicts to and from disk. Loading uses `torch.load(weights_only=True)`: tensors, numbers,
strings and plain containers only, so no pickled code runs.
"""
from __future__ import annotations

import io
import logging
import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from src.errors import MissingFileError, UserError


log = logging.getLogger(__name__)

LAST_NAME = "last.pt"


def checkpoint_dir(run_dir: Path) -> Path:
    """Where a run's checkpoints live."""
    return Path(run_dir) / "checkpoints"


def last_checkpoint(run_dir: Path) -> Path | None:
    """The run's `last.pt`, or None when the run has not written one yet."""
    path = checkpoint_dir(run_dir) / LAST_NAME
    return path if path.is_file() else None


def checkpoint_file(value: str | Path, key: str, hint: str = "") -> Path:
    """`value` (a config key's checkpoint path, `~` expanded) as an existing file, or an error naming `key`."""
    path = Path(str(value)).expanduser()
    if not path.is_file():
        raise MissingFileError(f"{key}={value}: no such file; checkpoints are written to <run dir>/checkpoints/ "
                               f"(last.pt and best_*.pt){hint}")
    return path


def atomic_write_bytes(data: bytes, path: Path) -> None:
    """Write `data` to `path` so that a crash at any moment leaves either the old file or the new one.

    The bytes go to a temporary file in the same directory (same filesystem, so the rename is atomic),
    are fsync'ed, then os.replace'd over the target; the directory is fsync'ed so the rename survives
    a power loss too.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def serialize(state: dict[str, Any]) -> bytes:
    """torch.save `state` into bytes (once, then written to as many files as needed)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu", mmap: bool = False) -> dict[str, Any]:
    """Load a checkpoint file (weights_only=True); a missing, truncated or foreign file is an error naming it.

    mmap=True maps the tensors' bytes instead of reading them (only what is used is read): a cheap look at a
    checkpoint's config and progress.
    """
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"checkpoint {path} does not exist; pass an existing file "
                               "(e.g. <run dir>/checkpoints/last.pt)")
    try:
        if mmap:
            try:
                return torch.load(path, map_location=map_location, weights_only=True, mmap=True)
            except RuntimeError:  # a file in torch's legacy (non-zip) format cannot be mapped: read it
                pass
        return torch.load(path, map_location=map_location, weights_only=True)
    except (RuntimeError, EOFError, zipfile.BadZipFile, pickle.UnpicklingError, ValueError) as err:
        # torch's own text for an UnpicklingError suggests weights_only=False, which is wrong advice here.
        why = "" if isinstance(err, pickle.UnpicklingError) else f" ({str(err).splitlines()[0][:200]})"
        raise UserError(f"checkpoint {path} cannot be read ({path.stat().st_size} bytes): it is truncated, "
                        f"corrupt, or not a file this trainer wrote{why}. Use another checkpoint, e.g. a "
                        "best_*.pt of the same run") from None


class CheckpointSaver:
    """Writes one run's `last.pt` and its best-k files, ranked by a metric (higher or lower is better)."""

    def __init__(self, run_dir: Path, metric: str, keep_best: int, *, higher_is_better: bool) -> None:
        """`higher_is_better`: the metric's direction, as the run's task declares it (Task.higher_is_better)."""
        self.dir = checkpoint_dir(run_dir)
        self.metric = metric
        self.keep_best = keep_best
        self.higher_is_better = higher_is_better

    def best_k_update(self, best: list[list], step: int, metrics: dict[str, float]
                      ) -> tuple[list[list], str | None, list[str]]:
        """Best-k bookkeeping for an evaluation at `step`: (new best list, new file name or None, dropped names).

        Pure (no files touched), so every rank can keep the same list; only rank 0 writes.
        """
        value = metrics.get(self.metric)
        if value is None or self.keep_best <= 0 or not self._is_top_k(best, value):
            return [list(b) for b in best], None, []
        name = f"best_step{step:07d}_{self.metric}{value:.4f}.pt"
        ranked = sorted([*map(list, best), [float(value), name]], key=lambda b: b[0], reverse=self.higher_is_better)
        return ranked[: self.keep_best], name, [old for _, old in ranked[self.keep_best:]]

    def write(self, state: dict[str, Any], best_name: str | None = None, dropped: tuple[str, ...] | list[str] = ()
              ) -> Path:
        """Write `last.pt` (and `best_name` with the same bytes), then delete the dropped best files."""
        data = serialize(state)
        if best_name is not None:
            atomic_write_bytes(data, self.dir / best_name)
            log.info("new best %s: %s", self.metric, self.dir / best_name)
        for old in dropped:
            (self.dir / old).unlink(missing_ok=True)
        path = self.dir / LAST_NAME
        atomic_write_bytes(data, path)
        return path

    def _is_top_k(self, best: list[list], value: float) -> bool:
        if len(best) < self.keep_best:
            return True
        worst = best[-1][0]
        return value > worst if self.higher_is_better else value < worst
