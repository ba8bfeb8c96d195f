"""The one run directory shared by all ranks (decided on rank 0, Hydra's run dir, and broadcast), and the
checkpoint `trainer.resume` points at.

Hydra runs in every torchrun process and resolves `hydra.run.dir` in each: with the default
`outputs/${now:...}` two ranks starting in different seconds would each get a folder. Rank 0's
choice wins; another rank's own folder is removed when Hydra created it empty.
"""
from __future__ import annotations

import datetime
import logging
import os
from pathlib import Path

from src import comm
from src.engine.checkpoint.files import LAST_NAME, checkpoint_file, last_checkpoint

log = logging.getLogger(__name__)


def _hydra_output_dir() -> Path | None:
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    return Path(HydraConfig.get().runtime.output_dir)


def resolve_run_dir(default_root: str = "outputs") -> Path:
    """Absolute run directory, identical on every rank (a collective when distributed)."""
    own = _hydra_output_dir()
    if own is None:
        own = Path(default_root) / datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    own = own.resolve()
    run_dir = Path(comm.broadcast_object(str(own) if comm.is_main_process() else None))
    if own != run_dir and own.is_dir() and not any(own.iterdir()):
        try:
            os.rmdir(own)  # the empty folder Hydra made for this rank's own timestamp
        except OSError:
            pass
    if comm.is_main_process():
        run_dir.mkdir(parents=True, exist_ok=True)
    comm.barrier()
    return run_dir


def run_dir_given() -> bool:
    """True when the run dir was set on the command line (`hydra.run.dir`, or `hydra.sweep.dir` with -m),
    or when no Hydra app chose it; False for Hydra's default new timestamped folder."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return True
    hydra = HydraConfig.get()
    key = "hydra.sweep.dir=" if hydra.mode == RunMode.MULTIRUN else "hydra.run.dir="
    return any(o.startswith(key) for o in hydra.overrides.hydra)


def newest_run_with_checkpoint(run_dir: Path) -> Path | None:
    """The most recently written `checkpoints/last.pt` among the run dirs next to `run_dir` (not itself)."""
    found = [p for p in run_dir.parent.glob(f"*/checkpoints/{LAST_NAME}") if p.parents[1] != run_dir]
    return max(found, key=lambda p: p.stat().st_mtime).parents[1] if found else None


def resume_checkpoint(resume: str, run_dir: Path) -> Path | None:
    """The checkpoint trainer.resume points at: none -> None, auto -> the run dir's last.pt (or None), else a file.

    resume=auto in a run dir without a checkpoint starts from scratch. When the run dir is the default
    new timestamp (it can never hold a checkpoint), that is said loudly, with the way to resume the
    newest earlier run: choosing it silently would guess between runs.
    """
    if resume == "none":
        return None
    if resume != "auto":
        return checkpoint_file(resume, "trainer.resume", "; or use auto (the run dir's last.pt) or none")
    found = last_checkpoint(run_dir)
    if found is not None or not comm.is_main_process():
        return found
    if run_dir_given():
        log.info("trainer.resume=auto: no checkpoint in %s yet, starting from scratch", run_dir)
        return None
    earlier = newest_run_with_checkpoint(run_dir)
    hint = (f" The newest earlier run with a checkpoint is {earlier}: resume it with hydra.run.dir={earlier} "
            "trainer.resume=auto" if earlier is not None else "")
    log.warning("trainer.resume=auto found nothing to resume: the run dir %s is new (the default "
                "outputs/<date_time>), so training STARTS FROM SCRATCH. To resume a run, pass its directory: "
                "hydra.run.dir=<that run dir> trainer.resume=auto, or trainer.resume=<its checkpoints/last.pt>.%s",
                run_dir, hint)
    return None
