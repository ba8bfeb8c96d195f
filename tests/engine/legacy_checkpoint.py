"""A frozen copy of the first checkpoint format (no `format_version` key), to prove old files still load.

This is what the trainer wrote before src/engine/checkpoint/state.py owned the format: its end-of-epoch snapshot
plus the best-k list the saver added. Keep it frozen: it is the reference for old checkpoints on users'
disks, not a second definition of the current format.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hydra import compose, initialize_config_dir

from src.config import config_dict, validate_config
from src.engine.optim import build_optimizer, build_scheduler
from src.models import build_model

REPO = Path(__file__).resolve().parents[2]


def _rng_state() -> dict[str, Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
        "cuda": [],
    }


def write_format_v0(path: Path, overrides: list[str], *, epoch: int, step: int, steps_per_epoch: int) -> dict:
    """Train nothing, but write a complete first-format checkpoint of the composed config at `path`.

    The model, SGD momentum state (one real step), scheduler, disabled GradScaler and EMA are real objects
    built by today's builders, so loading the file exercises every key. Returns the stored dict. The weights
    come from the config's seed; the caller's global generator is left as it was.
    """
    with torch.random.fork_rng(devices=[]):
        return _write_format_v0(path, overrides, epoch=epoch, step=step, steps_per_epoch=steps_per_epoch)


def _write_format_v0(path: Path, overrides: list[str], *, epoch: int, step: int, steps_per_epoch: int) -> dict:
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = validate_config(compose("train", overrides=overrides))
    plain = config_dict(cfg)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, cfg.norm, 8 if cfg.data.num_classes is None else cfg.data.num_classes)
    optimizer = build_optimizer(model, cfg.optim, cfg.data.batch_size)
    scheduler = build_scheduler(optimizer, cfg.sched, steps_per_epoch, steps_per_epoch * cfg.trainer.epochs)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    ema = torch.optim.swa_utils.AveragedModel(
        model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(cfg.trainer.ema_decay), use_buffers=True)
    size = cfg.data.image_size
    model(torch.randn(4, 3, size, size)).logsumexp(1).mean().backward()
    optimizer.step()
    for _ in range(step):
        scheduler.step()
    ema.update_parameters(model)
    state = {
        "model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(), "ema": ema.state_dict() if cfg.trainer.ema else None,
        "epoch": epoch, "step": step,
        "sampler": {"epoch": epoch, "micro_batch": 0},
        "rng": [_rng_state()], "world_size": 1, "config": plain, "metrics": {"top1": 12.5, "loss": 2.0},
        "best": [[12.5, f"best_step{step:07d}_top112.5000.pt"]],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
    return state
