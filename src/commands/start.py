"""How a training run starts: which folder it writes, which config it trains with, what it resumes from, and the
one moment it begins to write (`StartPlan.commit`).

`plan_start` runs on every rank before any process group and reads only: a new run into a folder that holds
another run is refused (`trainer.overwrite=true` moves the old one aside, at the commit); `trainer.resume=<run
folder>` (and `trainer.resume=auto` in a folder with a run) continues with the run's saved config and the command
line's resumable keys (src/commands/resume_config.py); the config is validated. The folder Hydra created for this
launch is removed first, while it is empty: until the commit, after every check of src/commands/train.py (config,
device, data, model, checkpoint) has passed on every rank, a failed start leaves no trace.
"""
from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from src import comm
from src.commands.resume_config import Change, global_batch_change, merge_for_resume
from src.commands.run_dir import (HydraLaunch, discard_if_new, hydra_launch, newest_run_with_checkpoint,
                                  shown_path)
from src.commands.run_folder import PREVIOUS_NAME, RunFolder
from src.commands.start_log import launch_rank, log_into
from src.config import TrainConfig, config_dict, validate_config
from src.engine.checkpoint.state import read_checkpoint, trained_step
from src.engine.trackers.sink import ResumePoint
from src.errors import UserError

log = logging.getLogger("src.commands.train")


@dataclass
class StartPlan:
    """What a start decided before the process group: the config, the run folder, what it resumes from."""

    config: TrainConfig
    run_dir: Path  # absolute; this rank's choice (rank 0's wins once the group exists: agree_run_dir)
    checkpoint: Optional[Path] = None  # the checkpoint to load, if any
    resume_point: Optional[ResumePoint] = None  # a resume's step: outputs after it are dropped
    replace_old_run: bool = False  # trainer.overwrite=true and the folder holds a run: move it aside at the commit
    overrides: list[str] = field(default_factory=list)  # what .hydra/overrides.yaml records
    hydra: Optional[dict[str, Any]] = None  # what .hydra/hydra.yaml records (a new run only)
    honoured: list[Change] = field(default_factory=list)  # a resume's command-line changes

    def commit(self, run_dir: Path) -> None:
        """Every rank passed every check: rank 0 makes the folder (moving an old run aside when asked) and writes
        `.hydra/`; then every rank also logs into it. A collective."""
        comm.barrier()  # a rank that failed never gets here (torchrun then ends the others): nothing is written
        if comm.is_main_process():
            run_dir.mkdir(parents=True, exist_ok=True)
            folder = RunFolder(run_dir)
            if self.replace_old_run and folder.holds_run():
                moved = folder.move_aside()
                log.warning("trainer.overwrite=true: the run that was in %s is now in %s", run_dir, moved)
            folder.write_saved(config_dict(self.config), self.overrides, self.hydra)
        comm.barrier()
        log_into(run_dir, comm.get_rank())


def plan_start(cfg: DictConfig | dict, world_size: int) -> StartPlan:
    """Decide the start on this rank, reading only (Hydra's new empty folder aside); UserError for a refusal."""
    launch = hydra_launch(cfg)
    discard_if_new(launch.output_dir)  # first: whatever fails below, Hydra's new folder does not stay behind
    composed = _plain(cfg)
    own = launch.output_dir or Path("outputs", datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")).resolve()
    trainer = composed.get("trainer") or {}
    resume, overwrite = str(trainer.get("resume", "none")), bool(trainer.get("overwrite", False))
    if overwrite and resume != "none":
        raise UserError(f"trainer.overwrite=true starts a new run in place of the folder's old one; it cannot be "
                        f"combined with trainer.resume={resume} (which continues a run): drop one of them")
    source, checkpoint = _resume_source(resume, launch, own)
    if source is not None:
        return _resume_from_folder(source, composed, launch, world_size)
    folder = RunFolder(own)
    inside = checkpoint is not None and folder.path.resolve() in checkpoint.resolve().parents
    if folder.holds_run() and not inside and not overwrite:
        raise UserError(_occupied_message(folder, launch))
    config = validate_config(cfg, world_size=world_size)
    point = None
    if checkpoint is not None:
        ckpt = read_checkpoint(checkpoint, mmap=True)
        point = ResumePoint(int(trained_step(ckpt) or 0), evaluated=bool(ckpt.get("metrics")))
    return StartPlan(config, own, checkpoint, point, replace_old_run=overwrite and folder.holds_run(),
                     overrides=list(launch.overrides or []), hydra=launch.hydra_cfg)


def _resume_source(resume: str, launch: HydraLaunch, own: Path) -> tuple[Optional[RunFolder], Optional[Path]]:
    """(the run folder a resume continues, or None; the checkpoint file trainer.resume names, or None)."""
    if resume == "none":
        return None, None
    if resume == "auto":
        folder = RunFolder(own)
        if folder.holds_run() and (folder.checkpoint is not None or folder.has_saved_config()):
            return folder, None  # (a folder whose start failed before any output holds no run: a new one starts)
        if not launch.dir_given and launch_rank() == 0:
            _warn_fresh_default_folder(own)
        elif launch_rank() == 0:
            log.info("trainer.resume=auto: no run in %s yet, starting one", own)
        return None, None
    path = Path(resume).expanduser()
    if path.is_file():
        return None, path
    if not path.is_dir():
        raise UserError(f"trainer.resume={resume}: no such file or folder; pass a run folder (its checkpoints/ "
                        "and metrics.jsonl are inside), a checkpoint file (<run folder>/checkpoints/last.pt or "
                        "best_*.pt), auto (the hydra.run.dir folder's run) or none")
    folder = RunFolder(path.resolve())
    if launch.dir_given and launch.output_dir is not None and launch.output_dir.resolve() != folder.path:
        raise UserError(f"trainer.resume={resume} continues that run in its own folder, but hydra.run.dir="
                        f"{launch.output_dir} names another one: drop hydra.run.dir, or start a new run there from "
                        f"the run's checkpoint with trainer.resume={path / 'checkpoints' / 'last.pt'}")
    if folder.checkpoint is None and not folder.has_saved_config():
        why = (f" (an old run moved aside is in {path / PREVIOUS_NAME})" if (path / PREVIOUS_NAME).is_dir() else "")
        raise UserError(f"trainer.resume={resume}: the folder holds no run to continue: no checkpoints/last.pt and "
                        f"no .hydra/config.yaml{why}. Pass the folder a run wrote (hydra.run.dir of that run), or a "
                        "checkpoint file")
    return folder, None


def _resume_from_folder(folder: RunFolder, composed: dict[str, Any], launch: HydraLaunch,
                        world_size: int) -> StartPlan:
    """The run's saved config with the command line's resumable keys; its last.pt, if it has written one."""
    ckpt = read_checkpoint(folder.checkpoint, mmap=True) if folder.checkpoint is not None else None
    saved = folder.saved_config(ckpt)
    if saved is None:
        raise UserError(f"trainer.resume: {folder.path} has a checkpoint but no config to continue with")
    saved_overrides, saved_choices = folder.saved_launch()
    shown = shown_path(folder.path)
    merged, honoured = merge_for_resume(saved, composed, launch, saved_choices, shown)
    merged.setdefault("trainer", {})["overwrite"] = False  # per launch (and refused with a resume), as trainer.resume
    config = validate_config(merged, world_size=world_size)
    if ckpt is not None:
        change = global_batch_change(int(ckpt.get("world_size", 1)), ckpt["config"], world_size,
                                     config.data.batch_size, config.trainer.grad_accum_steps)
        if change is not None:
            raise UserError(f"trainer.resume={shown}: {change}. A resume keeps the run's global batch; to train "
                            f"with another, start a new run from trainer.resume={shown}/checkpoints/last.pt")
    if launch_rank() == 0:
        for change in honoured:
            if change.key != "trainer.resume":
                log.info("resuming %s with %s", shown, change)
    point = (ResumePoint(int(trained_step(ckpt) or 0), evaluated=bool(ckpt.get("metrics"))) if ckpt is not None
             else ResumePoint(0, evaluated=False))  # a saved run without a checkpoint starts again from step 0
    # What .hydra/overrides.yaml adds: the overrides behind the honoured changes (trainer.resume is per launch).
    applied = [o for o in launch.overrides or [] if _override_key(o) != "trainer.resume"
               and any(c.key == _override_key(o) or c.key.startswith(_override_key(o) + ".") for c in honoured)]
    return StartPlan(config, folder.path, folder.checkpoint, point,
                     overrides=_merged_overrides(saved_overrides, applied), honoured=honoured)


def _merged_overrides(saved: list[str], new: list[str]) -> list[str]:
    """The run's overrides with the resume's honoured ones, a later one replacing an earlier one of the same key."""
    keys = {_override_key(o) for o in new}
    return [o for o in saved if _override_key(o) not in keys] + list(new)


def _override_key(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0].split("@", 1)[0]


def _occupied_message(folder: RunFolder, launch: HydraLaunch) -> str:
    shown = shown_path(folder.path)
    where = f"hydra.run.dir={shown}" if launch.dir_given else f"the run folder {shown}"
    return (f"{where} already holds a run ({folder.describe()}); a new run (trainer.resume=none) there would "
            f"overwrite it, so nothing was started. Continue that run: trainer.resume={shown}; or start this one in "
            f"another folder: hydra.run.dir=<a new folder>; or replace it: trainer.overwrite=true (moves the old "
            f"run into {shown}/{PREVIOUS_NAME}/<its date>/, deletes nothing)")


def _warn_fresh_default_folder(own: Path) -> None:
    earlier = newest_run_with_checkpoint(own)
    hint = f" The newest earlier run with a checkpoint is {earlier}: trainer.resume={earlier}" if earlier else ""
    log.warning("trainer.resume=auto found nothing to resume: the run dir %s is new (the default outputs/<date_time>), "
                "so training STARTS FROM SCRATCH. To continue a run, pass its folder: trainer.resume=<run folder> "
                "(or hydra.run.dir=<run folder> trainer.resume=auto).%s", own, hint)


def _plain(cfg: DictConfig | dict) -> dict[str, Any]:
    """The composed config as a plain, resolved dict without Hydra's node."""
    plain = dict(cfg) if isinstance(cfg, dict) else OmegaConf.to_container(cfg, resolve=False)
    plain.pop("hydra", None)
    return OmegaConf.to_container(OmegaConf.create(plain), resolve=True)  # type: ignore[return-value]
