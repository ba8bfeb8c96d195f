"""`predict.py ckpt=PATH input=DIR_OR_FILE out=DIR`: a trained model on new images, alone or under torchrun.

Steps: check the arguments, read the trained run (src/commands/trained_run.py, as evaluate.py
does: the stored config with the command line's overrides, SyncBN rebuilt as BatchNorm), list the inputs
(src/commands/predict_io.py), start the process group if torchrun launched us, find the inputs that cannot be decoded
(each rank a share, gathered: every rank leaves out the same ones; skip_unreadable=false stops at the first instead),
give each rank a contiguous run of fixed batches of the others (EvalBatchSampler: every image exactly once, in the
same batch at any world size), predict with
trainer.eval_num_threads CPU threads, gather to rank 0, and write there (nothing with trainer.dry_run=true). Each
image goes through the task's predict transform and collation (its TaskData), and the task decides what is written
(Task.predict, with its own options: Task.predict_options, e.g. topk; the table of what each task writes is
docs/tasks.md's).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Dict, Optional

import torch
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader, Dataset

from src import comm, process_group
from src.commands.dry_run import print_summary, trained_run_facts
from src.commands.predict_io import UNREADABLE_CSV, ImageFiles, find_unreadable, list_inputs, write_unreadable
from src.commands.trained_run import TrainedRun, load_trained_run, overrides_of
from src.config import TrainConfig
from src.cpu_threads import configure_threads, fixed_threads
from src.data import Batch, ClosableLoader, EvalBatchSampler, close_loaders, collate_stacked
from src.data.image_files import UnreadableImage, read_sample
from src.data.worker_cap import loader_workers
from src.dataclass_config import extend, foreign_settings
from src.errors import UserError
from src.precision import autocast, model_dtype
from src.tasks import Task, all_tasks

USAGE = "python predict.py ckpt=<run dir>/checkpoints/last.pt input=<image or folder> out=<folder> [topk=5]"


@dataclass
class PredictConfig:
    """predict.py's keys (conf/predict.yaml); each task adds its own (Task.predict_options: topk, draw, ...)."""

    ckpt: Optional[str] = None
    input: Optional[str] = None
    out: Optional[str] = None
    batch_size: int = 32
    num_workers: int = 2
    ema: bool = False
    # Inputs that cannot be decoded are left out, named at the end and listed in out/unreadable.csv; false: the
    # first one stops predict.py with its error.
    skip_unreadable: bool = True
    # Overrides of the stored training config (trained_run.overrides_of): non-null keys replace the checkpoint's.
    device: Optional[str] = None
    data: Dict[str, Any] = field(default_factory=dict)
    model: Dict[str, Any] = field(default_factory=dict)
    norm: Dict[str, Any] = field(default_factory=dict)
    trainer: Dict[str, Any] = field(default_factory=dict)


@functools.lru_cache(maxsize=None)
def predict_schema() -> type[PredictConfig]:
    """PredictConfig with every registered task's predict.py keys (built on first use, once the tasks are loaded)."""
    return extend(PredictConfig, [(t.name, t.predict_options) for t in all_tasks() if t.predict_options])


def register_predict_schema() -> None:
    """Store predict_schema() in Hydra's ConfigStore as `predict_schema` (conf/predict.yaml's first default)."""
    ConfigStore.instance().store(name="predict_schema", node=predict_schema())


# conf/predict.yaml composes onto `predict_schema`: stored when this module (predict.py's body) is imported.
register_predict_schema()


def run(cfg: DictConfig) -> Path:
    """Predict every input of cfg.input with cfg.ckpt; returns what was written (the CSV or the mask folder)."""
    source, out_dir = _paths(cfg)
    if int(cfg.batch_size) < 1:
        raise UserError(f"batch_size must be >= 1, got batch_size={cfg.batch_size}")
    trained = load_trained_run(cfg.ckpt, ema=bool(cfg.ema), overrides=overrides_of(cfg))
    config, device = trained.config, trained.device
    options = _task_options(cfg, trained.task, config)
    base, relative = list_inputs(source, out_dir)  # before the process group: a bad input= fails fast

    owns_group = not comm.is_initialized()
    process_group.init_distributed(device, timeout_s=config.trainer.dist_timeout_s,
                          init_timeout_s=config.trainer.dist_init_timeout_s)
    try:
        if device.type == "cpu":
            configure_threads(config.trainer.num_threads, comm.get_local_world_size())
        task, workers = trained.task, loader_workers(int(cfg.num_workers), "num_workers")  # this process's share
        skipped = _unreadable(source, base, relative, workers, bool(cfg.skip_unreadable))
        left_out = {i for i, _ in skipped}
        readable = [r for i, r in enumerate(relative) if i not in left_out]
        loader = _loader(config, task, base, readable, int(cfg.batch_size), workers)
        try:
            if config.trainer.dry_run:
                _dry_run(trained, loader, len(readable), out_dir, [relative[i] for i, _ in skipped])
                return out_dir
            with fixed_threads(config.trainer.eval_num_threads if device.type == "cpu" else 0):
                written = task.predict(loader, partial(_forward, trained), files=readable, out_dir=out_dir,
                                       class_names=list(trained.class_names), batch_count=len(loader),
                                       options=options)
        finally:  # the loader workers end here, also on an error (src/data/closable_loader.py says why)
            close_loaders(loader)
        if comm.is_main_process():
            _report_unreadable(out_dir, [(relative[i], reason) for i, reason in skipped])
        comm.barrier()
        return written
    finally:
        if owns_group:
            process_group.destroy()


def _unreadable(source: Path, base: Path, relative: list[Path], threads: int, skip: bool) -> list[tuple[int, str]]:
    """(index, reason) of every input that cannot be decoded, the same on every rank (each rank checks a share, one
    all_gather); with skip=false the first one raises UnreadableImage on every rank, and so does a folder of which
    none can be read."""
    share = range(comm.get_rank(), len(relative), comm.get_world_size())
    found = sorted(r for part in comm.all_gather_object(find_unreadable(base, relative, share, threads)) for r in part)
    if found and not skip:
        index, reason = found[0]
        raise UnreadableImage.of(base / relative[index], reason, where=f"input={base}, sample {index}")
    if found and len(found) == len(relative):
        index, reason = found[0]
        raise UserError(f"input={source}: none of the {len(relative)} image(s) can be read ({relative[index]}: {reason}"
                        f"{'' if len(found) == 1 else ', ...'}); check that the files are images and were copied whole")
    return found


def _report_unreadable(out_dir: Path, skipped: list[tuple[Path, str]]) -> None:
    """Rank 0, at the end: name the inputs that were left out, list them in out/unreadable.csv (a list from an
    earlier run into this folder is removed when none were left out this time)."""
    path = out_dir / UNREADABLE_CSV
    if not skipped:
        path.unlink(missing_ok=True)
        return
    write_unreadable(path, [(r.as_posix(), reason) for r, reason in skipped])
    shown = ", ".join(r.as_posix() for r, _ in skipped[:5]) + (f" and {len(skipped) - 5} more" if len(skipped) > 5
                                                                else "")
    print(f"skipped {len(skipped)} input(s) that cannot be read as images: {shown}; listed with the reasons in {path} "
          "(skip_unreadable=false stops at the first instead)", flush=True)


def _task_options(cfg: DictConfig, task: Task, config: Optional[TrainConfig] = None) -> Any:
    """The checkpoint's task's predict.py options (validated; `config` the trained run's, for what a task's drawing
    needs of it); another task's set away from its default is refused: nothing would read it."""
    values = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(predict_schema()), cfg))
    parts = [(t.name, t.predict_options) for t in all_tasks() if t.predict_options]
    for key, value, owners in foreign_settings(values, parts, {task.name}):
        raise UserError(f"{key}={value!r} is not read by this checkpoint's task, {task.name}: it is an option of "
                        f"{' and '.join(owners)} predictions; remove it")
    return task.predict_settings(values, config)


def _paths(cfg: DictConfig) -> tuple[Path, Path]:
    """(input, out) after checking that ckpt, input and out were all given (ckpt's file is checked when read)."""
    missing = [k for k in ("ckpt", "input", "out") if not cfg.get(k)]
    if missing:
        raise UserError(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} required: {USAGE}")
    return Path(str(cfg.input)).expanduser(), Path(str(cfg.out)).expanduser()


def _loader(config: TrainConfig, task: Task, base: Path, relative: list[Path], batch_size: int,
            num_workers: int) -> ClosableLoader:
    """This rank's run of fixed batches of the inputs (EvalBatchSampler) as Batches (no targets), through the
    task's predict transform, collation and batch size."""
    dataset = _Inputs(ImageFiles(base, relative, task.data.predict(config.data)), base)
    kwargs: dict[str, Any] = {"num_workers": num_workers}
    if num_workers > 0:
        kwargs["persistent_workers"] = False
    # Fixed blocks of inputs per batch (EvalBatchSampler): each image meets the same neighbours, so the same
    # padding and arithmetic, at any world size.
    sampler = EvalBatchSampler(len(dataset), task.predict_batch_size(batch_size), comm.get_rank(),
                               comm.get_world_size())
    return ClosableLoader(dataset, batch_sampler=sampler, collate_fn=task.data.collate or collate_stacked, **kwargs)


class _Inputs(Dataset):
    """The input files; one that cannot be decoded is named with its place among them (input=..., sample i)."""

    def __init__(self, files: ImageFiles, base: Path) -> None:
        self.files, self.where = files, f"input={base}"

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> Any:
        return read_sample(self.files, index, self.where)


def _forward(trained: TrainedRun, batch: Batch) -> Any:
    """The model's eval outputs for a batch of inputs, on the run's device and dtype, under its autocast."""
    settings = trained.config.trainer
    batch = batch.to(trained.device, model_dtype(trained.model))
    if settings.channels_last:
        batch = batch.channels_last()
    with torch.inference_mode(), autocast(settings.amp, trained.device):
        return trained.task.eval_forward(trained.model, batch.images)


def _dry_run(trained: TrainedRun, loader: DataLoader, inputs: int, out_dir: Path, unreadable: list[Path]) -> None:
    """trainer.dry_run: one batch of this rank's inputs through the model, a summary, nothing written."""
    facts = trained_run_facts(trained, loader, "predicting")
    facts["inputs"] = (f"{inputs} image(s), {loader.batch_sampler.batch_size} per batch, {len(loader)} batch(es) "
                       "on rank 0")
    if unreadable:
        names = ", ".join(r.as_posix() for r in unreadable[:5]) + (" ..." if len(unreadable) > 5 else "")
        facts["unreadable"] = f"{len(unreadable)} input(s) would be skipped: {names}"
    facts["out"] = f"{out_dir} (not written: dry run)"
    print_summary("predict.py", facts)
