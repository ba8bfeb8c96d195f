"""`predict.py ckpt=PATH input=DIR_OR_FILE out=DIR`: a trained model on new images, alone or under torchrun.

Steps: check the arguments, read the checkpoint through src/engine/checkpoint/state.py (the format's owner;
weights_only=True) and its stored training config with the command line's overrides (as evaluate.py
does), start the process group if torchrun launched us, list
the inputs (src/commands/predict_io.py), give each rank a contiguous shard (ExactEvalSampler: every image
exactly once), predict, gather to rank 0, and write there:
- classification: each image through the training data's evaluation resize / crop
  (src.data.transforms.classification_predict_transform), the top-k classes and softmax probabilities
  -> out/predictions.csv;
- segmentation: each image at its own size, only normalised as in evaluation, the argmax per pixel
  -> one palette PNG per input, at the input's size (src.data.palette.save_mask_png, as evaluate.py's export).
"""
from __future__ import annotations

import itertools
import logging
import math
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader

from src import dist
from src.commands.predict_io import PREDICTIONS_CSV, ImageFiles, list_inputs, mask_names, write_predictions_csv

log = logging.getLogger(__name__)

USAGE = "python predict.py ckpt=<run dir>/checkpoints/last.pt input=<image or folder> out=<folder> [topk=5]"
# Keys of conf/predict.yaml that override the stored training config (evaluate.py's rule: non-null leaves).
OVERRIDE_SECTIONS = ("device", "data", "model", "norm", "trainer")
# Norms whose eval-mode forward is BatchNorm's with the running statistics: predicted with nn.BatchNorm2d,
# which needs neither the compiled SyncBN kernels nor NCCL (the state_dict keys are the same). Only the
# keys BatchNorm reads are kept: synchronisation settings are refused for norm=bn.
BATCHNORM_IN_EVAL = ("syncbn", "torch_syncbn")
BATCHNORM_KEYS = ("eps", "momentum", "affine_trainable")
# Masks travel to rank 0 in rounds of this many per rank (a 12-megapixel mask is 12 MB of uint8).
MASKS_PER_ROUND = 8


def run(cfg: DictConfig) -> Path:
    """Predict every input of cfg.input with cfg.ckpt; returns what was written (the CSV or the mask folder)."""
    from src.config import task_of, validate_config
    from src.commands.evaluate import training_config
    from src.engine.checkpoint.state import model_weights, read_checkpoint, stored_config

    ckpt_path, source, out_dir = _paths(cfg)
    if int(cfg.topk) < 1 or int(cfg.batch_size) < 1:
        raise ValueError(f"topk and batch_size must be >= 1, got topk={cfg.topk}, batch_size={cfg.batch_size}")
    ckpt = read_checkpoint(ckpt_path)
    overrides = OmegaConf.masked_copy(cfg, [k for k in OVERRIDE_SECTIONS if k in cfg])
    train_cfg = training_config(stored_config(ckpt), overrides)
    if train_cfg.norm.name in BATCHNORM_IN_EVAL:
        train_cfg.norm = {"name": "bn", **{k: train_cfg.norm[k] for k in BATCHNORM_KEYS if k in train_cfg.norm}}
    train_cfg = validate_config(train_cfg)
    task = task_of(train_cfg)
    weights = model_weights(ckpt, bool(cfg.ema), str(ckpt_path))
    base, relative = list_inputs(source, out_dir)  # before the process group: a bad input= fails fast

    device = dist.select_device(train_cfg.device)
    owns_group = not dist.is_initialized()
    dist.init_distributed(device, timeout_s=train_cfg.trainer.dist_timeout_s,
                          init_timeout_s=train_cfg.trainer.dist_init_timeout_s)
    try:
        from src.engine.seeding import configure_threads

        if device.type == "cpu":
            configure_threads(train_cfg.trainer.num_threads, dist.get_local_world_size())
        names = class_names(ckpt, train_cfg, weights)
        model = _model(train_cfg, weights, ckpt, str(ckpt_path), len(names), device)
        loader = _loader(train_cfg, task, base, relative, int(cfg.batch_size), int(cfg.num_workers))
        if task == "classification":
            written = _classify(model, loader, relative, names, min(int(cfg.topk), len(names)), train_cfg, device,
                                out_dir)
        else:
            written = _segment(model, loader, relative, train_cfg, device, out_dir, names)
        dist.barrier()
        return written
    finally:
        if owns_group:
            dist.destroy()


def _paths(cfg: DictConfig) -> tuple[Path, Path, Path]:
    missing = [k for k in ("ckpt", "input", "out") if not cfg.get(k)]
    if missing:
        raise ValueError(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} required: {USAGE}")
    ckpt = Path(str(cfg.ckpt)).expanduser()
    if not ckpt.is_file():
        raise FileNotFoundError(f"ckpt={cfg.ckpt}: no such file; checkpoints are written to "
                                "<run dir>/checkpoints/ (last.pt and best_*.pt)")
    return ckpt, Path(str(cfg.input)).expanduser(), Path(str(cfg.out)).expanduser()


def class_names(ckpt: dict[str, Any], train_cfg: DictConfig, weights: dict[str, torch.Tensor]) -> list[str]:
    """The training data's class names, stored in the checkpoint; numbered for checkpoints without them."""
    stored = ckpt.get("class_names")
    if stored:
        return [str(n) for n in stored]
    n = _num_classes_from_weights(train_cfg, weights)
    log.warning("%s classes: the checkpoint stores no class names (written by an older version); "
                "predictions name them 0..%d", n, n - 1)
    return [str(i) for i in range(n)]


def _num_classes_from_weights(train_cfg: DictConfig, weights: dict[str, torch.Tensor]) -> int:
    """The class count of a checkpoint without names: the output layers are the tensors whose first
    dimension follows num_classes (compared between two builds of the model)."""
    from src.models import build_model

    shapes = [{k: v.shape for k, v in build_model(train_cfg.model, train_cfg.norm, n).state_dict().items()}
              for n in (2, 3)]
    heads = [k for k in shapes[0] if shapes[0][k][:1] == (2,) and shapes[1][k][:1] == (3,)]
    if not heads or heads[0] not in weights:
        raise ValueError("cannot tell the number of classes of this checkpoint (no class names stored, no "
                         "classifier weights found)")
    return int(weights[heads[0]].shape[0])


def _model(train_cfg: DictConfig, weights: dict[str, torch.Tensor], ckpt: dict[str, Any], source: str,
           num_classes: int, device: torch.device) -> torch.nn.Module:
    from src.engine.amp import PRECISIONS
    from src.engine.checkpoint.state import load_model_weights
    from src.models import build_model

    model = build_model(train_cfg.model, train_cfg.norm, num_classes)
    load_model_weights(model, weights, ckpt["config"], OmegaConf.to_container(train_cfg, resolve=True), source)
    model.to(device, PRECISIONS[train_cfg.trainer.dtype]).eval()
    if train_cfg.trainer.channels_last:
        model.to(memory_format=torch.channels_last)
    return model


def _loader(train_cfg: DictConfig, task: str, base: Path, relative: list[Path], batch_size: int,
            num_workers: int) -> DataLoader:
    """This rank's contiguous shard of the inputs; segmentation one image per batch (each at its own size)."""
    from src.data import ExactEvalSampler
    from src.data.config import coerce
    from src.data.seg_transforms import segmentation_predict_transform
    from src.data.transforms import classification_predict_transform

    data_cfg = coerce(OmegaConf.to_container(train_cfg.data, resolve=True))
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
                      sampler=ExactEvalSampler(len(dataset), dist.get_rank(), dist.get_world_size()), **kwargs)


def _forward(model: torch.nn.Module, images: torch.Tensor, train_cfg: DictConfig, device: torch.device) -> torch.Tensor:
    """Logits (float32, or float64 for trainer.dtype=float64) under the training run's autocast."""
    from src.engine.amp import autocast, model_dtype, upcast

    images = images.to(device, model_dtype(model), non_blocking=True)
    if train_cfg.trainer.channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    with torch.inference_mode(), autocast(train_cfg.trainer.amp, device):
        out = model(images)
    return upcast(out["out"] if isinstance(out, dict) else out)


def _classify(model: torch.nn.Module, loader: DataLoader, relative: list[Path], names: list[str], k: int,
              train_cfg: DictConfig, device: torch.device, out_dir: Path) -> Path:
    rows: list[tuple[int, list[int], list[float]]] = []
    for images, indices in loader:
        probs = _forward(model, images, train_cfg, device).softmax(dim=1)
        top = probs.topk(k, dim=1)
        rows += [(int(i), c.tolist(), p.tolist()) for i, c, p in zip(indices, top.indices.cpu(), top.values.cpu())]
    gathered = sorted(r for part in dist.all_gather_object(rows) for r in part)
    _check_each_once([r[0] for r in gathered], len(relative))
    path = out_dir / PREDICTIONS_CSV
    if dist.is_main_process():
        write_predictions_csv(path, [relative[i].as_posix() for i, _, _ in gathered],
                              [[names[c] for c in cs] for _, cs, _ in gathered], [ps for _, _, ps in gathered])
        print(f"predicted {len(gathered)} image(s) on {dist.get_world_size()} process(es): {path}", flush=True)
    return path


def _segment(model: torch.nn.Module, loader: DataLoader, relative: list[Path], train_cfg: DictConfig,
             device: torch.device, out_dir: Path, names: list[str]) -> Path:
    """Masks go to rank 0 in rounds while predicting, so no rank holds more than a round of them."""
    from src.data.palette import save_mask_png

    targets = mask_names(relative)
    batches = iter(loader)  # one image per batch
    largest_shard = math.ceil(len(relative) / dist.get_world_size())  # ExactEvalSampler's first shard
    seen: list[int] = []
    for _ in range(math.ceil(largest_shard / MASKS_PER_ROUND)):
        chunk = []
        for images, indices in itertools.islice(batches, MASKS_PER_ROUND):
            pred = _forward(model, images, train_cfg, device).argmax(dim=1).to(torch.uint8).cpu()
            chunk += [(int(i), m.numpy()) for i, m in zip(indices, pred)]
        for part in dist.all_gather_object(chunk):  # every rank takes part in every round, maybe with none
            for index, mask in part:
                seen.append(index)
                if dist.is_main_process():
                    path = out_dir / targets[index]
                    path.parent.mkdir(parents=True, exist_ok=True)
                    save_mask_png(path, mask)
    _check_each_once(seen, len(relative))
    if dist.is_main_process():
        legend = ", ".join(f"{i}={n}" for i, n in enumerate(names))
        print(f"predicted {len(seen)} mask(s) on {dist.get_world_size()} process(es) under {out_dir} "
              f"(palette PNGs, pixel value = class: {legend})", flush=True)
    return out_dir


def _check_each_once(indices: list[int], expected: int) -> None:
    if sorted(indices) != list(range(expected)):
        raise RuntimeError(f"{len(indices)} predictions for {expected} inputs ({len(set(indices))} distinct): "
                           "every input must be predicted exactly once")
