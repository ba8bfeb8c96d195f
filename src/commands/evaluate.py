"""`evaluate.py ckpt=PATH`: evaluate a checkpoint with the config stored in it, alone or under torchrun.

Steps: read the checkpoint through src/engine/checkpoint/state.py (the format's owner; weights_only=True), take its
resolved training config, apply the command line's overrides (the non-null keys of the `data`, `model`, `norm`, `trainer` and `device` sections of
conf/evaluate.yaml), validate it like train.py does, start the process group if torchrun launched us,
rebuild data and model, load the weights (EMA weights with ema=true), evaluate exactly, print a table
and write JSON on rank 0.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from src import dist
from src.config import task_of, validate_config
from src.data import build_datasets, build_eval_loader
from src.engine.amp import PRECISIONS
from src.engine.evaluation.evaluator import evaluate
from src.engine.seeding import configure_threads
from src.engine.checkpoint.state import load_model_weights, model_weights, read_checkpoint, stored_config
from src.models import build_model

# Keys of conf/evaluate.yaml that belong to evaluate.py itself; every other section overrides the
# training config stored in the checkpoint.
OWN_KEYS = ("ckpt", "out", "export", "ema", "hydra")


def run(cfg: DictConfig) -> dict[str, float]:
    """Evaluate cfg.ckpt; returns the metrics (the same on every rank)."""
    ckpt_path = checkpoint_path(cfg)
    ckpt = read_checkpoint(ckpt_path)
    train_cfg = validate_config(training_config(stored_config(ckpt), cfg))
    weights = model_weights(ckpt, bool(cfg.ema), str(ckpt_path))
    weights_name = "ema" if cfg.ema else "model"

    device = dist.select_device(train_cfg.device)
    owns_group = not dist.is_initialized()
    dist.init_distributed(device, timeout_s=train_cfg.trainer.dist_timeout_s,
                          init_timeout_s=train_cfg.trainer.dist_init_timeout_s)
    try:
        if device.type == "cpu":  # as in training: this process's share of the node's cores
            configure_threads(train_cfg.trainer.num_threads, dist.get_local_world_size())
        metrics = _evaluate(train_cfg, task_of(train_cfg), weights, ckpt, str(ckpt_path), device, cfg.export)
        if dist.is_main_process():
            record = {"split": "val", "epoch": trained_epoch(ckpt), "step": ckpt.get("step"), **metrics,
                      "checkpoint": str(ckpt_path), "weights": weights_name,
                      "world_size": dist.get_world_size()}
            print(metrics_table(record, metrics), flush=True)
            if cfg.out:
                out = Path(str(cfg.out))
                out.parent.mkdir(parents=True, exist_ok=True)
                # NaN (absent classes) is written as the JSON extension NaN, as json.dumps does by default.
                out.write_text(json.dumps(record, indent=2) + "\n")
                print(f"metrics written to {out}", flush=True)
        dist.barrier()
        return metrics
    finally:
        if owns_group:
            dist.destroy()


def trained_epoch(ckpt: dict[str, Any]) -> int | None:
    """The epoch the checkpoint's last optimizer step belongs to: what metrics.jsonl's val row calls `epoch`.

    An end-of-epoch checkpoint stores the epoch to run next (micro-batch 0), a mid-epoch one the current.
    """
    epoch = ckpt.get("epoch")
    if epoch is None:
        return None
    at_epoch_start = (ckpt.get("sampler") or {}).get("micro_batch", 0) == 0
    return int(epoch) - 1 if at_epoch_start and int(epoch) > 0 else int(epoch)


def checkpoint_path(cfg: DictConfig) -> Path:
    """cfg.ckpt as an existing file, or an error that says how to pass one."""
    ckpt = cfg.get("ckpt")
    if not ckpt:
        raise ValueError("ckpt is required: python evaluate.py ckpt=<run dir>/checkpoints/last.pt "
                         "[out=metrics.json] [export=DIR] [ema=true] [data.root=...]")
    path = Path(str(ckpt)).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"ckpt={ckpt}: no such file; checkpoints are written to "
                                "<run dir>/checkpoints/ (last.pt and best_*.pt)")
    return path


def training_config(stored: dict[str, Any], cfg: DictConfig) -> DictConfig:
    """The checkpoint's training config with the command line's overrides applied."""
    base = OmegaConf.create({k: v for k, v in stored.items() if k != "hydra"})
    # The checkpoint already holds every weight: do not look for the (possibly absent) init files.
    base.model.weights = None
    base.model.backbone_weights = None
    base.model.pretrained = False  # nor timm's pretrained weights in the Hugging Face cache
    overrides = overrides_of(cfg)
    return OmegaConf.merge(base, overrides) if overrides else base


def overrides_of(cfg: DictConfig) -> dict[str, Any]:
    """The non-null leaves of the override sections of evaluate.yaml, as a nested dict."""
    def prune(node: Any) -> Any:
        if isinstance(node, dict):
            kept = {k: prune(v) for k, v in node.items()}
            return {k: v for k, v in kept.items() if v is not None and v != {}}
        return node

    plain = OmegaConf.to_container(cfg, resolve=True)
    return prune({k: v for k, v in plain.items() if k not in OWN_KEYS})


def _evaluate(train_cfg: DictConfig, task: str, weights: dict[str, torch.Tensor], ckpt: dict[str, Any],
              source: str, device: torch.device, export: Any) -> dict[str, float]:
    bundle = build_datasets(train_cfg.data, seed=train_cfg.seed)  # downloads once per node (zero_first inside)
    loader = build_eval_loader(bundle.val, train_cfg.data, dist.get_rank(), dist.get_world_size())
    model = build_model(train_cfg.model, train_cfg.norm, bundle.num_classes)
    load_model_weights(model, weights, ckpt["config"], OmegaConf.to_container(train_cfg, resolve=True), source)
    model.to(device, PRECISIONS[train_cfg.trainer.dtype])
    if train_cfg.trainer.channels_last:
        model.to(memory_format=torch.channels_last)
    return evaluate(model, loader, task, bundle.num_classes, device, amp=train_cfg.trainer.amp,
                    ignore_index=bundle.ignore_index, export=export, class_names=list(bundle.class_names))


def metrics_table(record: dict[str, Any], metrics: dict[str, float]) -> str:
    """A plain-text table of the metrics, with what was evaluated in the header."""
    head = (f"checkpoint {record['checkpoint']} (epoch {record['epoch']}, step {record['step']}, "
            f"{record['weights']} weights) on {record['world_size']} process(es)")
    width = max([len("metric")] + [len(k) for k in metrics])
    lines = [head, f"{'metric':<{width}}  value", f"{'-' * width}  ------"]
    for key, value in metrics.items():
        text = "n/a (class absent)" if isinstance(value, float) and math.isnan(value) else f"{value:.4f}"
        lines.append(f"{key:<{width}}  {text}")
    return "\n".join(lines)
