"""The one run directory shared by all ranks: decided on rank 0 (Hydra's run dir) and broadcast.

Hydra runs in every torchrun process and resolves `hydra.run.dir` in each: with the default
`outputs/${now:...}` two ranks starting in different seconds would each get a folder. Rank 0's
choice wins; another rank's own folder is removed when Hydra created it empty.
"""
from __future__ import annotations

import datetime
import logging
import os
from pathlib import Path

from src import dist

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
    run_dir = Path(dist.broadcast_object(str(own) if dist.is_main_process() else None))
    if own != run_dir and own.is_dir() and not any(own.iterdir()):
        try:
            os.rmdir(own)  # the empty folder Hydra made for this rank's own timestamp
        except OSError:
            pass
    if dist.is_main_process():
        run_dir.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    return run_dir
