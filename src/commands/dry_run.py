"""`trainer.dry_run=true`: what a command would run, checked with one batch and summarised; nothing written.

Each command validates its config, forms the process group and builds model and data exactly as a real run
does, then calls `forward_one_batch` (no optimizer step, no checkpoint, no metrics) and `print_summary`
(rank 0 only) instead of its loop. A failure anywhere in that path fails the dry run the same way.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import nn

from src import comm
from src.commands.trained_run import TrainedRun
from src.data.batch import Batch, as_batch
from src.data.device_transforms import DeviceTransform
from src.models import count_norm_layers
from src.precision import autocast, model_dtype
from src.tasks import Task


def forward_one_batch(module: nn.Module, batch: Batch, task: Task, *, device: torch.device, amp: str,
                      channels_last: bool, loss_fn: Optional[Callable[[Any, Any], torch.Tensor]] = None,
                      transform: Optional[DeviceTransform] = None) -> dict[str, Any]:
    """One forward of `batch` (moved as the trainer moves it, with `transform`) through `module` in its current
    mode, without gradients; shapes and loss.

    Training mode runs the task's training forward (with the targets), eval mode its evaluation forward. Every
    rank must call it (a training-mode SyncBN forward communicates). The loss, when asked for, is this rank's
    own: the dry run reduces nothing.
    """
    batch = batch.to(device, model_dtype(module), transform=transform)
    if channels_last:
        batch = batch.channels_last()
    with torch.no_grad(), autocast(amp, device):
        outputs = (task.forward(module, batch.images, batch.targets) if module.training
                   else task.eval_forward(module, batch.images))
        loss = loss_fn(outputs, batch.targets) if loss_fn is not None and batch.targets is not None else None
    result: dict[str, Any] = {"input": batch.describe(), "output": task.describe_output(outputs)}
    if loss is not None:
        value = float(loss)
        if not torch.isfinite(torch.tensor(value)):
            raise RuntimeError(f"dry run: the first batch's loss is {value} before any optimizer step; check the "
                               "data normalisation, trainer.dtype/amp and the model's initial weights")
        result["loss"] = value
    return result


def model_facts(model: nn.Module) -> dict[str, str]:
    """Parameter counts and the normalisation layers of `model`, as summary lines."""
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    norms = ", ".join(f"{name} x{count}" for name, count in sorted(count_norm_layers(model).items()))
    return {"parameters": f"{total:,} ({trainable:,} trainable)", "norm layers": norms or "none"}


def trained_run_facts(trained: TrainedRun, loader: Any, action: str) -> dict[str, str]:
    """evaluate.py's and predict.py's summary lines: the checkpoint, the model, the world, and one batch of this
    rank's shard through the model (every rank calls it; a rank may have an empty shard)."""
    config = trained.config
    batch = next(iter(loader), None)
    shape = "none (empty shard)"
    if batch is not None:
        out = forward_one_batch(trained.model, as_batch(batch), trained.task, device=trained.device,
                                amp=config.trainer.amp, channels_last=config.trainer.channels_last)
        shape = f"input {out['input']} -> output {out['output']}"
    return {
        "checkpoint": f"{trained.path} (epoch {trained.epoch}, step {trained.step}, {trained.weights} weights)",
        "model": f"{config.model.name} ({trained.task.name}, {len(trained.class_names)} classes), trained with "
                 f"norm={trained.trained_norm}, {action} with norm={config.norm.name}",
        **model_facts(trained.model),
        "world size": f"{comm.get_world_size()} process(es) on {trained.device}",
        "first batch": f"{shape} (rank 0)",
    }


def print_summary(title: str, facts: dict[str, Any]) -> None:
    """Print `facts` as aligned `key: value` lines under `title`, on rank 0 only."""
    if not comm.is_main_process():
        return
    width = max(len(key) for key in facts)
    lines = [f"dry run ({title}): config valid, model and data built, one batch forward; nothing written"]
    lines += [f"  {key:<{width}}  {value}" for key, value in facts.items()]
    print("\n".join(lines), flush=True)
