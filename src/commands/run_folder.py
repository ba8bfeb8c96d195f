"""A run folder: whether it holds a run, what to say about it, the config a resume starts from, and what a start
writes into it once every check has passed (`.hydra/`, an old run moved aside).

A folder holds a run when it has a checkpoint or metrics rows. Its saved config is `.hydra/config.yaml`, written
by the start that passed every check (the resolved config, exactly what the run trains with), so a failed start
never rewrites it. Folders from before that have only Hydra's own `.hydra/config.yaml` (written before any check
ran): for them the checkpoint's stored config is the saved config.
"""
from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any, Optional

import yaml

from src.engine.checkpoint.files import LAST_NAME, atomic_write_bytes, checkpoint_dir
from src.engine.checkpoint.state import read_checkpoint, stored_config, trained_step

METRICS_NAME = "metrics.jsonl"
PREVIOUS_NAME = "previous"  # trainer.overwrite=true moves an old run to <folder>/previous/<its date>/
HYDRA_DIR = ".hydra"
# The first line of the config this code writes; Hydra's own config.yaml (older runs) has none.
_SAVED_HEADER = "# SyncTrain: the resolved config of this run, written when its last start had passed every check\n"


class RunFolder:
    """One run folder (it need not exist)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @property
    def checkpoint(self) -> Optional[Path]:
        """`checkpoints/last.pt`, when there is one."""
        path = checkpoint_dir(self.path) / LAST_NAME
        return path if path.is_file() else None

    def holds_run(self) -> bool:
        """True when a run wrote here: a checkpoint, or metrics rows."""
        ckpts = checkpoint_dir(self.path)
        metrics = self.path / METRICS_NAME
        return (ckpts.is_dir() and any(ckpts.glob("*.pt"))) or (metrics.is_file() and metrics.stat().st_size > 0)

    def has_saved_config(self) -> bool:
        """True when a start passed every check here (or, in an older folder, Hydra saved a config)."""
        return (self.path / HYDRA_DIR / "config.yaml").is_file()

    def saved_config(self, ckpt: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
        """The config a resume starts from: ours, else the checkpoint's (`ckpt`, already read), else Hydra's."""
        path = self.path / HYDRA_DIR / "config.yaml"
        text = path.read_text(encoding="utf-8") if path.is_file() else None
        if text is not None and text.startswith(_SAVED_HEADER):
            return yaml.safe_load(text)
        if ckpt is not None:
            return stored_config(ckpt)
        return yaml.safe_load(text) if text else None

    def saved_launch(self) -> tuple[list[str], dict[str, Any]]:
        """The overrides the run was made with and its group choices (what `.hydra/` recorded; empty if nothing)."""
        overrides = _read_yaml(self.path / HYDRA_DIR / "overrides.yaml") or []
        hydra = (_read_yaml(self.path / HYDRA_DIR / "hydra.yaml") or {}).get("hydra") or {}
        return [str(o) for o in overrides], dict((hydra.get("runtime") or {}).get("choices") or {})

    def describe(self) -> str:
        """What the folder holds, in a few words: its last step and date, its best checkpoint's metric."""
        ckpt_path, metrics = self.checkpoint, self.path / METRICS_NAME
        step, best = None, None
        if ckpt_path is not None:
            try:
                ckpt = read_checkpoint(ckpt_path, mmap=True)
                step, best = trained_step(ckpt), (ckpt.get("best") or [None])[0]
            except (OSError, ValueError):
                step = None
        if step is None and metrics.is_file():
            step = max((int(r.get("step", 0)) for r in _jsonl(metrics)), default=None)
        newest = max((p for p in (ckpt_path, metrics) if p is not None and p.is_file()),
                     key=lambda p: p.stat().st_mtime, default=None)
        parts = [f"step {step}" if step is not None else "a run"]
        if newest is not None:
            parts.append(f"last written {_date(newest)}")
        if best:
            value, name = best
            metric = str(name).split("_", 2)[-1].removesuffix(f"{value:.4f}.pt")
            parts.append(f"best {metric}={value:.4g} ({checkpoint_dir(self.path).name}/{name})")
        return ", ".join(parts)

    def move_aside(self) -> Path:
        """Move everything here (but earlier moved runs) into previous/<date of the run>/; returns that folder."""
        entries = [p for p in self.path.iterdir() if p.name != PREVIOUS_NAME]
        newest = max((p.stat().st_mtime for p in entries), default=datetime.datetime.now().timestamp())
        stamp = datetime.datetime.fromtimestamp(newest).strftime("%Y-%m-%d_%H-%M-%S")
        target = self.path / PREVIOUS_NAME / stamp
        n = 1
        while target.exists():
            target, n = self.path / PREVIOUS_NAME / f"{stamp}-{n}", n + 1
        target.mkdir(parents=True)
        for entry in entries:
            os.rename(entry, target / entry.name)  # same filesystem: nothing copied, nothing deleted
        return target

    def write_saved(self, config: dict[str, Any], overrides: list[str], hydra: Optional[dict[str, Any]]) -> None:
        """Write `.hydra/config.yaml` (the resolved config), `overrides.yaml` and, when given, `hydra.yaml`."""
        folder = self.path / HYDRA_DIR
        dump = lambda data: yaml.safe_dump(data, sort_keys=False, default_flow_style=False)  # noqa: E731
        atomic_write_bytes((_SAVED_HEADER + dump(config)).encode(), folder / "config.yaml")
        atomic_write_bytes(dump(list(overrides)).encode(), folder / "overrides.yaml")
        if hydra is not None:
            atomic_write_bytes(dump(hydra).encode(), folder / "hydra.yaml")


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, yaml.YAMLError):
        return None


def _jsonl(path: Path) -> list[dict[str, Any]]:
    import json

    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def _date(path: Path) -> str:
    return datetime.datetime.fromtimestamp(path.stat().st_mtime).strftime("%Y-%m-%d %H:%M")
