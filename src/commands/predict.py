"""`predict.py ckpt=PATH input=DIR_OR_FILE out=DIR`: a trained model on new images, alone or under torchrun.

Steps: check the arguments, read the trained run (src/engine/checkpoint/trained_run.py, as evaluate.py
does: the stored config with the command line's overrides, SyncBN rebuilt as BatchNorm), list the inputs
(src/commands/predict_io.py), start the process group if torchrun launched us, give each rank a contiguous shard (ExactEvalSampler: every image
exactly once), predict, gather to rank 0, and write there (nothing with trainer.dry_run=true):
- classification: each image through the training data's evaluation resize / crop
  (src.data.transforms.classification_predict_transform), the top-k classes and softmax probabilities
  -> out/predictions.csv;
- segmentation: each image at its own size, only normalised as in evaluation, the argmax per pixel
  -> one palette PNG per input, at the input's size (src.data.palette.save_mask_png, as evaluate.py's export).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader

from src import comm, process_group
from src.commands.dry_run import print_summary, trained_run_facts
from src.commands.predict_io import PREDICTIONS_CSV, ImageFiles, list_inputs, mask_names, write_predictions_csv
from src.config import TrainConfig
from src.data import ExactEvalSampler
from src.data.config import coerce
from src.data.palette import save_mask_png
from src.data.samplers import check_each_index_once
from src.data.seg_transforms import segmentation_predict_transform
from src.data.transforms import classification_predict_transform
from src.engine.amp import autocast, model_dtype, upcast
from src.engine.checkpoint.trained_run import TrainedRun, load_trained_run, overrides_of
from src.engine.cpu_threads import configure_threads
from src.engine.evaluation.exports import gather_masks

USAGE = "python predict.py ckpt=<run dir>/checkpoints/last.pt input=<image or folder> out=<folder> [topk=5]"
EACH_ONCE_HINT = "the loader must use ExactEvalSampler"


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
        loader = _loader(config, trained.task, base, relative, int(cfg.batch_size), int(cfg.num_workers))
        if config.trainer.dry_run:
            _dry_run(trained, loader, len(relative), out_dir)
            return out_dir
        if trained.task == "classification":
            written = _classify(trained, loader, relative, min(int(cfg.topk), len(trained.class_names)), out_dir)
        else:
            written = _segment(trained, loader, relative, out_dir)
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


def _loader(config: TrainConfig, task: str, base: Path, relative: list[Path], batch_size: int,
            num_workers: int) -> DataLoader:
    """This rank's contiguous shard of the inputs; segmentation one image per batch (each at its own size)."""
    data_cfg = coerce(config.data)
    if task == "classification":
        transform = classification_predict_transform(data_cfg)
    else:
        transform = segmentation_predict_transform(data_cfg)
        batch_size = 1
    dataset = ImageFiles(base, relative, transform)
    kwargs: dict[str, Any] = {"num_workers": num_workers}
    if num_workers > 0:
        kwargs["persistent_workers"] = False
    return DataLoader(dataset, batch_size=batch_size, drop_last=False,
                      sampler=ExactEvalSampler(len(dataset), comm.get_rank(), comm.get_world_size()), **kwargs)


def _forward(trained: TrainedRun, images: torch.Tensor) -> torch.Tensor:
    """Logits (float32, or float64 for trainer.dtype=float64) under the training run's autocast."""
    settings = trained.config.trainer
    images = images.to(trained.device, model_dtype(trained.model), non_blocking=True)
    if settings.channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    with torch.inference_mode(), autocast(settings.amp, trained.device):
        out = trained.model(images)
    return upcast(out["out"] if isinstance(out, dict) else out)


def _classify(trained: TrainedRun, loader: DataLoader, relative: list[Path], k: int, out_dir: Path) -> Path:
    rows: list[tuple[int, list[int], list[float]]] = []
    for images, indices in loader:
        probs = _forward(trained, images).softmax(dim=1)
        top = probs.topk(k, dim=1)
        rows += [(int(i), c.tolist(), p.tolist()) for i, c, p in zip(indices, top.indices.cpu(), top.values.cpu())]
    gathered = sorted(r for part in comm.all_gather_object(rows) for r in part)
    check_each_index_once([r[0] for r in gathered], len(relative), "inputs", EACH_ONCE_HINT)
    path = out_dir / PREDICTIONS_CSV
    if comm.is_main_process():
        names = trained.class_names
        write_predictions_csv(path, [relative[i].as_posix() for i, _, _ in gathered],
                              [[names[c] for c in cs] for _, cs, _ in gathered], [ps for _, _, ps in gathered])
        print(f"predicted {len(gathered)} image(s) on {comm.get_world_size()} process(es): {path}", flush=True)
    return path


def _segment(trained: TrainedRun, loader: DataLoader, relative: list[Path], out_dir: Path) -> Path:
    """Masks go to rank 0 in rounds while predicting (gather_masks), so no rank holds more than a round."""
    targets = mask_names(relative)

    def masks() -> Iterator[tuple[int, np.ndarray]]:
        for images, indices in loader:  # one image per batch
            pred = _forward(trained, images).argmax(dim=1).to(torch.uint8).cpu()
            yield from ((int(i), m.numpy()) for i, m in zip(indices, pred))

    def write(index: int, mask: np.ndarray) -> None:
        path = out_dir / targets[index]
        path.parent.mkdir(parents=True, exist_ok=True)
        save_mask_png(path, mask)

    seen = gather_masks(masks(), len(loader), write)
    check_each_index_once(seen, len(relative), "inputs", EACH_ONCE_HINT)
    if comm.is_main_process():
        legend = ", ".join(f"{i}={n}" for i, n in enumerate(trained.class_names))
        print(f"predicted {len(seen)} mask(s) on {comm.get_world_size()} process(es) under {out_dir} "
              f"(palette PNGs, pixel value = class: {legend})", flush=True)
    return out_dir


def _dry_run(trained: TrainedRun, loader: DataLoader, inputs: int, out_dir: Path) -> None:
    """trainer.dry_run: one batch of this rank's inputs through the model, a summary, nothing written."""
    facts = trained_run_facts(trained, loader, "predicting")
    facts["inputs"] = f"{inputs} image(s), {loader.batch_size} per batch, {len(loader)} batch(es) on rank 0"
    facts["out"] = f"{out_dir} (not written: dry run)"
    print_summary("predict.py", facts)
