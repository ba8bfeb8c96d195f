"""`evaluate.py ckpt=PATH`: evaluate a checkpoint with the config stored in it, alone or under torchrun.

Steps: read the trained run (src/commands/trained_run.py: the stored training config with the
command line's overrides, validated as train.py does; the model rebuilt from it, SyncBN as BatchNorm, with
the weights or their EMA), start the process group if torchrun launched us, rebuild the validation data,
evaluate exactly, print a table and write JSON on rank 0. `trainer.dry_run=true` stops after one batch.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from src import comm, process_group
from src.commands.dry_run import print_summary, trained_run_facts
from src.commands.trained_run import TrainedRun, load_trained_run, overrides_of
from src.cpu_threads import configure_threads
from src.data import DataBundle, build_datasets, build_eval_loader, close_loaders
from src.errors import UserError
from src.evaluation.loop import evaluate

USAGE = ("python evaluate.py ckpt=<run dir>/checkpoints/last.pt [out=metrics.json] [export=DIR] [ema=true] "
         "[data.root=...]")


def run(cfg: DictConfig) -> dict[str, float]:
    """Evaluate cfg.ckpt; returns the metrics (the same on every rank)."""
    if not cfg.get("ckpt"):
        raise UserError(f"ckpt is required: {USAGE}")
    trained = load_trained_run(cfg.ckpt, ema=bool(cfg.ema), overrides=overrides_of(cfg))
    config, device = trained.config, trained.device
    owns_group = not comm.is_initialized()
    process_group.init_distributed(device, timeout_s=config.trainer.dist_timeout_s,
                          init_timeout_s=config.trainer.dist_init_timeout_s)
    try:
        if device.type == "cpu":  # as in training: this process's share of the node's cores
            configure_threads(config.trainer.num_threads, comm.get_local_world_size())
        task = trained.task
        bundle = build_datasets(config.data, task.data, seed=config.seed)  # downloads once per node (zero_first inside)
        _check_class_count(trained, bundle)
        loader = build_eval_loader(bundle.val, config.data, comm.get_rank(), comm.get_world_size(),
                                   collate=task.data.collate)
        try:
            return _evaluate(cfg, trained, bundle, loader)
        finally:  # the loader workers end here, also on an error (src/data/closable_loader.py says why)
            close_loaders(loader)
    finally:
        if owns_group:
            process_group.destroy()


def _evaluate(cfg: DictConfig, trained: TrainedRun, bundle: DataBundle, loader: Any) -> dict[str, float]:
    """Evaluate on `loader`, print the table and write the JSON (rank 0); the dry run stops after one batch."""
    config, device = trained.config, trained.device
    if config.trainer.dry_run:
        _dry_run(trained, bundle, loader)
        return {}
    metrics = evaluate(trained.model, loader, trained.task, bundle.num_classes, device, amp=config.trainer.amp,
                       export=cfg.export, class_names=list(bundle.class_names), threads=config.trainer.eval_num_threads)
    if comm.is_main_process():
        record = {"split": "val", "epoch": trained.epoch, "step": trained.step, **metrics,
                  "checkpoint": str(trained.path), "weights": trained.weights,
                  "world_size": comm.get_world_size()}
        print(metrics_table(record, metrics), flush=True)
        if cfg.out:
            out = Path(str(cfg.out))
            out.parent.mkdir(parents=True, exist_ok=True)
            # NaN (absent classes) is written as the JSON extension NaN, as json.dumps does by default.
            out.write_text(json.dumps(record, indent=2) + "\n")
            print(f"metrics written to {out}", flush=True)
    comm.barrier()
    return metrics


def _check_class_count(trained: TrainedRun, bundle: DataBundle) -> None:
    """The data must have the classes the model was trained to predict."""
    if bundle.num_classes != len(trained.class_names):
        raise UserError(f"{trained.path} predicts {len(trained.class_names)} classes but data.name="
                        f"{trained.config.data.name} has {bundle.num_classes}: evaluate it on the data it was "
                        "trained on (drop the data overrides)")


def _dry_run(trained: TrainedRun, bundle: DataBundle, loader: Any) -> None:
    """trainer.dry_run: one batch of this rank's shard through the model, a summary, nothing written."""
    facts = trained_run_facts(trained, loader, "evaluated")
    facts["data"] = (f"{trained.config.data.name}: {len(bundle.val)} val samples, "
                     f"{loader.batch_sampler.batch_size} per batch, {len(loader)} batch(es) on rank 0")
    print_summary("evaluate.py", facts)


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
