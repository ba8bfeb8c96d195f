"""Checkpoint files: atomic writes, `last.pt` plus best-k, loading with weights_only=True.

A checkpoint is a plain dict (see PLAN.md): model (state_dict of the unwrapped model), optimizer,
scheduler, scaler, ema, epoch, step, sampler, rng, config, metrics, best. Everything in it is a
tensor, a number, a string, None, or a list/tuple/dict of those, so `torch.load(weights_only=True)`
accepts it: no pickled Python objects, no arbitrary code on load.
"""
from __future__ import annotations

import io
import logging
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

LAST_NAME = "last.pt"


def checkpoint_dir(run_dir: Path) -> Path:
    """Where a run's checkpoints live."""
    return Path(run_dir) / "checkpoints"


def last_checkpoint(run_dir: Path) -> Path | None:
    """The run's `last.pt`, or None when the run has not written one yet."""
    path = checkpoint_dir(run_dir) / LAST_NAME
    return path if path.is_file() else None


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


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    """Atomically write one checkpoint file."""
    atomic_write_bytes(serialize(state), path)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint written by this module (weights_only=True: tensors and plain containers only)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist; pass an existing file (e.g. <run dir>/checkpoints/last.pt)")
    return torch.load(path, map_location=map_location, weights_only=True)


class CheckpointSaver:
    """Keeps `last.pt` and the best-k checkpoints of one run by a metric (higher or lower is better)."""

    def __init__(self, run_dir: Path, metric: str, keep_best: int, best: list[list] | None = None) -> None:
        self.dir = checkpoint_dir(run_dir)
        self.metric = metric
        self.keep_best = keep_best
        self.higher_is_better = metric != "loss"
        # [[value, file name], ...], best first; stored in every checkpoint so resume keeps it.
        self.best: list[list] = [list(b) for b in (best or [])]

    def save_last(self, state: dict[str, Any]) -> Path:
        """Write `last.pt` (atomically)."""
        path = self.dir / LAST_NAME
        save_checkpoint({**state, "best": self.best}, path)
        return path

    def save(self, state: dict[str, Any], metrics: dict[str, float] | None) -> Path:
        """Write `last.pt`, and a best-k file when `metrics` ranks among the k best (older ones deleted)."""
        data = None
        value = None if metrics is None else metrics.get(self.metric)
        if value is not None and self.keep_best > 0 and self._is_top_k(value):
            name = f"best_step{state['step']:07d}_{self.metric}{value:.4f}.pt"
            self.best.append([float(value), name])
            self.best.sort(key=lambda b: b[0], reverse=self.higher_is_better)
            dropped, self.best = self.best[self.keep_best:], self.best[: self.keep_best]
            data = serialize({**state, "best": self.best})
            atomic_write_bytes(data, self.dir / name)
            for _, old in dropped:
                (self.dir / old).unlink(missing_ok=True)
            log.info("new best %s=%.4f: %s", self.metric, value, self.dir / name)
        path = self.dir / LAST_NAME
        atomic_write_bytes(data if data is not None else serialize({**state, "best": self.best}), path)
        return path

    def _is_top_k(self, value: float) -> bool:
        if len(self.best) < self.keep_best:
            return True
        worst = self.best[-1][0]
        return value > worst if self.higher_is_better else value < worst


def capture_rng_state() -> dict[str, Any]:
    """This process's RNG states (python, numpy, torch CPU, CUDA) as weights_only-loadable values."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),  # (int, tuple of ints, float | None)
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of capture_rng_state."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = state["numpy"]
    np.random.set_state((np_state["name"], np_state["keys"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])

