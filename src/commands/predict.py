"""`predict.py ckpt=PATH input=DIR_OR_FILE out=DIR`: a trained model on new images, alone or under torchrun.

Steps: check the arguments, read the trained run (src/commands/trained_run.py, as evaluate.py
does: the stored config with the command line's overrides, SyncBN rebuilt as BatchNorm), list the inputs
(src/tasks/predict_io.py), start the process group if torchrun launched us, give each rank a contiguous run of
fixed batches (EvalBatchSampler: every image exactly once, in the same batch at any world size), predict with
trainer.eval_num_threads CPU threads, gather to rank 0, and write there (nothing with
trainer.dry_run=true). Each image goes through the task's predict transform (src/data/task_data.py), and
the task decides what is written (Task.predict in src/tasks/):
- classification: the top-k classes and softmax probabilities -> out/predictions.csv;
- segmentation: each image at its own size, the argmax per pixel -> one palette PNG per input, at the
  input's size (src.data.palette.save_mask_png, as evaluate.py's export).
"""
from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader

from src import comm, process_group
from src.commands.dry_run import print_summary, trained_run_facts
from src.config import TrainConfig
from src.data import EvalBatchSampler
from src.data.config import coerce
from src.commands.trained_run import TrainedRun, load_trained_run, overrides_of
from src.engine.cpu_threads import configure_threads, fixed_threads
from src.precision import autocast, model_dtype
from src.tasks import Task, get_task
from src.tasks.predict_io import ImageFiles, list_inputs

USAGE = "python predict.py ckpt=<run dir>/checkpoints/last.pt input=<image or folder> out=<folder> [topk=5]"


def run(cfg: DictConfig) -> Path:
    """Predict every input of cfg.input with cfg.ckpt; returns what was written (the CSV or the mask folder)."""
    source, out_dir = _paths(cfg)
    if int(cfg.topk) < 1 or int(cfg.batch_size) < 1:
        raise ValueError(f"topk and batch_size must be >= 1, got topk={cfg.topk}, batch_size={cfg.batch_size}")
    trained = load_trained_run(cfg.ckpt, ema=bool(cfg.ema), overrides=overrides_of(cfg))
    config, device = trained.config, trained.device
    base, relative = list_inputs(source, out_dir)  # before the process group: a bad input= fails fast

    owns_group = not comm.is_initialized()
    process_group.init_distributed(device, timeout_s=config.trainer.dist_timeout_s,
                          init_timeout_s=config.trainer.dist_init_timeout_s)
    try:
        if device.type == "cpu":
            configure_threads(config.trainer.num_threads, comm.get_local_world_size())
        task = get_task(trained.task)
        loader = _loader(config, task, base, relative, int(cfg.batch_size), int(cfg.num_workers))
        if config.trainer.dry_run:
            _dry_run(trained, loader, len(relative), out_dir)
            return out_dir
        with fixed_threads(config.trainer.eval_num_threads if device.type == "cpu" else 0):
            written = task.predict(loader, partial(_forward, trained, task), files=relative, out_dir=out_dir,
                                   class_names=list(trained.class_names), topk=int(cfg.topk), batch_count=len(loader),
                                   draw=bool(cfg.get("draw", False)),
                                   score_threshold=float(cfg.get("score_threshold", 0.0)))
        comm.barrier()
        return written
    finally:
        if owns_group:
            process_group.destroy()


def _paths(cfg: DictConfig) -> tuple[Path, Path]:
    """(input, out) after checking that ckpt, input and out were all given (ckpt's file is checked when read)."""
    missing = [k for k in ("ckpt", "input", "out") if not cfg.get(k)]
    if missing:
        raise ValueError(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} required: {USAGE}")
    return Path(str(cfg.input)).expanduser(), Path(str(cfg.out)).expanduser()


def _loader(config: TrainConfig, task: Task, base: Path, relative: list[Path], batch_size: int,
            num_workers: int) -> DataLoader:
    """This rank's run of fixed batches of the inputs (EvalBatchSampler), through the task's predict transform."""
    dataset = ImageFiles(base, relative, task.data.predict(coerce(config.data)))
    kwargs: dict[str, Any] = {"num_workers": num_workers}
    if num_workers > 0:
        kwargs["persistent_workers"] = False
    if task.data.collate is not None:  # e.g. detection: a list of images, each at its own size
        kwargs["collate_fn"] = task.data.collate
    # Fixed blocks of inputs per batch (EvalBatchSampler): each image meets the same neighbours, so the same
    # padding and arithmetic, at any world size.
    sampler = EvalBatchSampler(len(dataset), task.predict_batch_size(batch_size), comm.get_rank(),
                               comm.get_world_size())
    return DataLoader(dataset, batch_sampler=sampler, **kwargs)


def _forward(trained: TrainedRun, task: Task, images: Any) -> Any:
    """The model's eval outputs for a batch of inputs, on the run's device and dtype, under its autocast."""
    settings = trained.config.trainer
    images = task.move_images(images, trained.device, model_dtype(trained.model))
    if settings.channels_last and isinstance(images, torch.Tensor):  # tasks of image lists refuse channels_last
        images = images.contiguous(memory_format=torch.channels_last)
    with torch.inference_mode(), autocast(settings.amp, trained.device):
        return task.eval_forward(trained.model, images)


def _dry_run(trained: TrainedRun, loader: DataLoader, inputs: int, out_dir: Path) -> None:
    """trainer.dry_run: one batch of this rank's inputs through the model, a summary, nothing written."""
    facts = trained_run_facts(trained, loader, "predicting")
    facts["inputs"] = (f"{inputs} image(s), {loader.batch_sampler.batch_size} per batch, {len(loader)} batch(es) "
                       "on rank 0")
    facts["out"] = f"{out_dir} (not written: dry run)"
    print_summary("predict.py", facts)
