"""What Hydra says about a launch (its run folder, the command line's overrides and group choices), and the one run
folder all ranks share.

Hydra creates its run folder (`hydra.run.dir`, default `outputs/<date>_<time>`) before our code runs, in every
torchrun process. `NewRunFolders`, a Hydra callback (conf/train.yaml), notes which folders did not exist before,
so that a start can remove the one Hydra just made while it is still empty: the folder appears only once every
check has passed (src/commands/start.py), and a failed start leaves no new folder behind. Hydra writes nothing
into it (`hydra.output_subdir: null`); the run's `.hydra/` is written after the checks (src/commands/run_folder.py).

With the default timestamped folder two ranks starting in different seconds would each get a folder: rank 0's
choice wins (`agree_run_dir`).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from src import comm
from src.engine.checkpoint.files import LAST_NAME

log = logging.getLogger(__name__)

# Folders Hydra was about to create in this process (absolute paths): a run folder equal to or below one of them
# is new. Filled by NewRunFolders before Hydra creates them; empty outside a Hydra app.
_NEW_ROOTS: set[Path] = set()

try:  # Hydra's callback base class (hydra >= 1.1); without it the callback is a plain object Hydra still calls
    from hydra.experimental.callback import Callback as _Callback
except ImportError:  # pragma: no cover - hydra < 1.1 is not supported anyway
    _Callback = object  # type: ignore[misc,assignment]


class NewRunFolders(_Callback):  # type: ignore[misc]
    """Hydra callback: remembers the run (or sweep) folder when it does not exist yet, before Hydra creates it."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """A single run: `hydra.run.dir` (Hydra resolves it once per config, so this is the folder it makes)."""
        _note_if_new(OmegaConf.select(config, "hydra.run.dir"))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """A sweep: every job folder below a new `hydra.sweep.dir` is new too."""
        _note_if_new(OmegaConf.select(config, "hydra.sweep.dir"))


def _note_if_new(folder: Any) -> None:
    """Remember the outermost folder of `folder`'s path that does not exist yet (Hydra makes the parents too)."""
    if folder is None:
        return
    path = Path(os.path.abspath(str(folder)))
    if path.exists():
        return
    while not path.parent.exists():
        path = path.parent
    _NEW_ROOTS.add(path)


def _new_root(folder: Path) -> Optional[Path]:
    """The folder Hydra created for this process that `folder` is (or is below), if any."""
    folder = Path(os.path.abspath(folder))
    return next((root for root in _NEW_ROOTS if folder == root or root in folder.parents), None)


def made_by_this_launch(folder: Path) -> bool:
    """True when Hydra created `folder` for this process (it did not exist when the launch started)."""
    return _new_root(folder) is not None


@dataclass
class HydraLaunch:
    """What the command line said, as Hydra composed it."""

    output_dir: Optional[Path] = None  # Hydra's run folder for this process (absolute); None outside Hydra
    dir_given: bool = True  # hydra.run.dir (hydra.sweep.dir with -m) set on the command line, or no Hydra app
    overrides: Optional[list[str]] = None  # the task overrides as typed; None: unknown (run() called in code)
    choices: dict[str, Any] = field(default_factory=dict)  # group -> option (list-valued groups are absent)
    hydra_cfg: Optional[dict[str, Any]] = None  # {"hydra": Hydra's own node}, for `.hydra/hydra.yaml`


def hydra_launch(cfg: Any) -> HydraLaunch:
    """The launch as Hydra describes it: inside a Hydra app its HydraConfig, else `cfg.hydra` when the config
    was composed with return_hydra_config=True, else nothing known (a run folder under ./outputs)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if HydraConfig.initialized():
        hydra = HydraConfig.get()
        output_dir = Path(hydra.runtime.output_dir)
    elif isinstance(cfg, DictConfig) and OmegaConf.select(cfg, "hydra.run.dir", default=None) is not None:
        hydra = cfg.hydra
        output_dir = Path(os.path.abspath(str(hydra.run.dir)))
    else:
        return HydraLaunch()
    key = "hydra.sweep.dir=" if hydra.get("mode") == RunMode.MULTIRUN else "hydra.run.dir="
    given = any(str(o).startswith(key) for o in hydra.overrides.hydra)
    return HydraLaunch(output_dir=output_dir, dir_given=given, overrides=[str(o) for o in hydra.overrides.task],
                       choices=dict(OmegaConf.to_container(hydra.runtime.choices)),
                       hydra_cfg={"hydra": OmegaConf.to_container(hydra, resolve=False, enum_to_str=True)})


def discard_if_new(folder: Optional[Path]) -> None:
    """Remove `folder`, and the parents Hydra made for it, when they are new to this launch and still empty (the run
    folder is made again, once every check has passed, by the rank that writes the run)."""
    root = _new_root(folder) if folder is not None else None
    if root is None:
        return
    path = Path(os.path.abspath(folder))
    while True:
        try:
            path.rmdir()  # only an empty folder; a peer rank may have removed it already
        except FileNotFoundError:
            pass
        except OSError:
            return  # not empty: something else is in it
        if path == root:
            return
        path = path.parent


def agree_run_dir(own: Path) -> Path:
    """Rank 0's run folder, on every rank (a collective when distributed)."""
    return Path(comm.broadcast_object(str(own) if comm.is_main_process() else None))


def shown_path(path: Path) -> str:
    """`path` as a user would type it here: relative to the working directory when below it, else absolute."""
    absolute = Path(os.path.abspath(path))
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)


def newest_run_with_checkpoint(run_dir: Path) -> Path | None:
    """The most recently written `checkpoints/last.pt` among the run dirs next to `run_dir` (not itself)."""
    found = [p for p in run_dir.parent.glob(f"*/checkpoints/{LAST_NAME}") if p.parents[1] != run_dir]
    return max(found, key=lambda p: p.stat().st_mtime).parents[1] if found else None
