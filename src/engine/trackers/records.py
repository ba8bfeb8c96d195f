"""<run dir>/trackers.json: the open tracker runs' ids, written by the tracker thread as soon as each opens.

Checkpoints hold the same records (TrainState.trackers), but a tracker may open its run after the
first checkpoint was written (a slow server, MLflow creating its SQLite tables): a resume then finds
the id here, so `trainer.resume=auto` still continues the same tracker run.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

FILE_NAME = "trackers.json"


def read_records(run_dir: Path) -> dict[str, dict[str, str]]:
    """The run dir's tracker records ({} when there are none or the file is unreadable)."""
    path = Path(run_dir) / FILE_NAME
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        log.warning("%s is unreadable (%s): tracker runs that the checkpoint does not name start afresh", path, err)
        return {}
    return {str(k): dict(v) for k, v in data.items() if isinstance(v, dict)}


def write_records(run_dir: Path, records: dict[str, dict[str, str]]) -> None:
    """Replace the run dir's tracker records atomically."""
    path = Path(run_dir) / FILE_NAME
    tmp = path.with_name(f".{FILE_NAME}.tmp")
    tmp.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
