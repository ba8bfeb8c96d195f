"""Exact distributed evaluation: every validation sample counted once, the same metrics for any world size.

The loader comes from src.data.build_eval_loader (EvalBatchSampler: fixed blocks of dataset indices as
batches, whole blocks per rank, no padding) and yields Batches of (images, targets, indices) (src/data/batch.py).
Ranks may therefore run different numbers of batches, so the per-batch loop never communicates: the task's
evaluation forward (Task.eval_forward) runs each batch, its evaluator (src/tasks/<task>/) accumulates the
outputs, and all collectives happen once, in its compute(), in the same order on every rank. How each task keeps
its results exact is in its package; the helpers they share are src/evaluation/exact.py.

Bitwise the same at any world size: each image is computed in the same batch (the sampler) with the same
number of CPU threads (`threads`, trainer.eval_num_threads), so its outputs are the same bits whichever rank
computes it, and the evaluators reduce them in dataset order.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from src.cpu_threads import fixed_threads
from src.data.batch import as_batch
from src.evaluation.protocol import EvalContext, EvaluatedTask
from src.precision import autocast, model_dtype
from src.unwrap import eval_mode, without_ddp

LossFn = Callable[[Any, Any], torch.Tensor]


def evaluate(
    model: nn.Module,
    loader: Any,
    task: EvaluatedTask,
    num_classes: int,
    device: torch.device | str,
    *,
    amp: str = "none",
    loss_fn: LossFn | None = None,
    export: str | Path | None = None,
    class_names: list[str] | None = None,
    threads: int = 0,
) -> dict[str, float]:
    """Evaluate on the loader's shard of every rank; returns the same metrics dict on every rank.

    `task` is the run's Task (src.tasks.get_task(name) for a registered one); the metrics are the task's
    (classification: {"loss", "top1", "top5"}, top-k in percent; segmentation: {"loss", "miou", "pixel_acc",
    "iou_<class>"...}, 0-1).
    `loss_fn(outputs, targets)` should return unreduced losses (per sample [N], or per pixel [N,H,W] with
    ignored pixels at 0); default: the task's own. `export=DIR` writes predictions in dataset order from
    rank 0. `threads` > 0: the intra-op CPU threads during the evaluation on a CPU device (restored after);
    the same number on every rank makes the results bitwise independent of the world size. Must be called
    on every rank (it ends with collectives).
    """
    if isinstance(task, str):  # evaluation sits below the task registry and does not look names up
        raise TypeError(f"evaluate() takes a Task object, not its name: pass src.tasks.get_task({task!r})")
    device = torch.device(device)
    # Not through DDP: ranks run different numbers of batches, and DDP's forward may synchronise buffers.
    # A compiled bare model (trainer.compile) is kept: evaluation runs its compiled eval-mode graph.
    net = without_ddp(model)
    evaluator = task.evaluator(EvalContext(
        num_classes=num_classes, device=device, dataset_size=_dataset_size(loader),
        class_names=class_names, loss_fn=loss_fn, export=Path(export) if export is not None else None))
    dtype = model_dtype(net)
    with fixed_threads(threads if device.type == "cpu" else 0), eval_mode(net), torch.inference_mode():
        for batch in loader:
            batch = as_batch(batch).to(device, dtype)
            with autocast(amp, device):
                outputs = task.eval_forward(net, batch.images)
            evaluator.process(outputs, batch.targets, batch.indices)
        return evaluator.compute()


def _dataset_size(loader: Any) -> int | None:
    """len(loader.dataset), for the each-sample-once check; None when it has none."""
    try:
        return len(loader.dataset)
    except (AttributeError, TypeError):
        return None
