"""Exact distributed evaluation: every validation sample counted once, the same metrics for any world size.

The loader comes from src.data.build_eval_loader (ExactEvalSampler: contiguous uneven shards, no padding)
and yields (images, targets, indices). Ranks may therefore run different numbers of batches, so the
per-batch loop never communicates; all collectives happen once, after it, in the same order on every rank.

- Classification: each rank keeps one row per sample (index, loss, prediction, top-1 hit, top-5 hit);
  the rows of all ranks are gathered, sorted by dataset index and reduced in that order. top1 and top5
  are counts, the same for any world size; the loss is the same sum in the same order, so it differs
  from a one-process evaluation only where the per-sample losses do (float rounding of logits, which
  depends on batch composition, thread count and CPU): within 1e-6 relative.
- Segmentation: each rank sums an int64 confusion matrix (exact, order-free), all_reduced once; the loss
  is gathered per image (sum over valid pixels, count) and summed in dataset order.
"""
from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from src import comm
from src.data.samplers import check_each_index_once
from src.engine.amp import autocast, model_dtype, upcast
from src.engine.evaluation.exports import export_classification, export_segmentation
from src.engine.evaluation.metrics import ConfusionMatrix, topk_correct
from src.unwrap import without_ddp

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Put `model` in eval mode for the block and restore every submodule's previous mode after it."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for m, training in modes:
            m.training = training


def evaluate(
    model: nn.Module,
    loader: Any,
    task: str,
    num_classes: int,
    device: torch.device | str,
    *,
    amp: str = "none",
    ignore_index: int = 255,
    loss_fn: LossFn | None = None,
    export: str | Path | None = None,
    class_names: list[str] | None = None,
) -> dict[str, float]:
    """Evaluate on the loader's shard of every rank; returns the same metrics dict on every rank.

    Classification -> {"loss", "top1", "top5"} (top-k in percent). Segmentation -> {"loss", "miou",
    "pixel_acc", "iou_<class>"...} (0-1; a class absent from both ground truth and predictions has
    iou NaN and is left out of miou). `loss_fn(logits, targets)` should return unreduced losses
    (per sample [N], or per pixel [N,H,W] with ignored pixels at 0); default: cross-entropy (ignoring
    `ignore_index` for segmentation). `export=DIR` writes predictions in dataset order from rank 0.
    Must be called on every rank (it ends with collectives).
    """
    if task not in ("classification", "segmentation"):
        raise ValueError(f"task must be 'classification' or 'segmentation', got {task!r}")
    device = torch.device(device)
    # Not through DDP: ranks run different numbers of batches, and DDP's forward may synchronise buffers.
    # A compiled bare model (trainer.compile) is kept: evaluation runs its compiled eval-mode graph.
    net = without_ddp(model)
    with eval_mode(net), torch.inference_mode():
        if task == "classification":
            return _evaluate_classification(net, loader, num_classes, device, amp, loss_fn, export)
        return _evaluate_segmentation(net, loader, num_classes, device, amp, ignore_index, loss_fn, export,
                                      class_names)


def _batches(loader: Any, device: torch.device,
             dtype: torch.dtype) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(images in the model's dtype, targets, indices) on `device` (indices stay on the CPU)."""
    for batch in loader:
        if not isinstance(batch, (tuple, list)) or len(batch) != 3:
            raise ValueError(
                "the evaluation loader must yield (images, targets, indices); build it with "
                "src.data.build_eval_loader, whose ExactEvalSampler provides the dataset indices"
            )
        images, targets, indices = batch
        yield (images.to(device, dtype, non_blocking=True), targets.to(device, non_blocking=True),
               torch.as_tensor(indices, dtype=torch.int64).cpu())


def _custom_loss(loss_fn: LossFn, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """loss_fn's output in float64: unreduced values, or a 0-dim batch mean (then exact only up to rounding)."""
    return loss_fn(logits, targets).double()


def _evaluate_classification(
    net: nn.Module, loader: Any, num_classes: int, device: torch.device, amp: str,
    loss_fn: LossFn | None, export: str | Path | None,
) -> dict[str, float]:
    rows = []  # per batch: [n, 5] float64 = index, loss, prediction, top-1 hit, top-5 hit
    for images, targets, indices in _batches(loader, device, model_dtype(net)):
        with autocast(amp, device):
            logits = net(images)
        logits = upcast(logits)
        if logits.dim() != 2 or logits.shape[1] != num_classes:
            raise ValueError(f"expected logits [N, {num_classes}], got {tuple(logits.shape)}")
        if loss_fn is None:
            loss = F.cross_entropy(logits, targets, reduction="none").double()
        else:
            loss = _custom_loss(loss_fn, logits, targets)
            if loss.dim() == 0:  # a batch mean: give each sample the mean, so the sum is right
                loss = loss.expand(len(targets))
        hits = topk_correct(logits, targets, (1, 5))
        rows.append(torch.stack([indices.double(), loss.cpu(), logits.argmax(1).double().cpu(),
                                 hits[:, 0].double().cpu(), hits[:, 1].double().cpu()], dim=1))
    local = torch.cat(rows) if rows else torch.zeros(0, 5, dtype=torch.float64)
    # The only collectives: gather every rank's rows (uneven counts are fine), then sort by index so the
    # reduction order is the one-process order whatever the world size.
    table = torch.cat(comm.all_gather_tensor(local))
    table = table[table[:, 0].argsort(stable=True)]
    _check_each_sample_once(table[:, 0].long(), loader)
    n = table.shape[0]
    if export is not None and comm.is_main_process():
        export_classification(Path(export), table[:, 0].long(), table[:, 2].long())
    if n == 0:
        return {"loss": math.nan, "top1": math.nan, "top5": math.nan}
    return {
        "loss": float(table[:, 1].sum() / n),
        "top1": 100.0 * float(table[:, 3].sum()) / n,
        "top5": 100.0 * float(table[:, 4].sum()) / n,
    }


def _segmentation_logits(output: Any) -> torch.Tensor:
    """The main head's logits: output["out"] for DeepLab-style dict outputs, else the tensor itself."""
    if isinstance(output, dict):
        if "out" not in output:
            raise ValueError(f"segmentation model returned keys {sorted(output)}, expected 'out'")
        return output["out"]
    return output


def _evaluate_segmentation(
    net: nn.Module, loader: Any, num_classes: int, device: torch.device, amp: str, ignore_index: int,
    loss_fn: LossFn | None, export: str | Path | None, class_names: list[str] | None,
) -> dict[str, float]:
    cm = ConfusionMatrix(num_classes, ignore_index, device=device)
    loss_rows = []  # per image: index, loss summed over valid pixels, number of valid pixels
    masks: list[tuple[int, torch.Tensor]] = []  # (index, uint8 prediction) kept only when exporting
    for images, targets, indices in _batches(loader, device, model_dtype(net)):
        with autocast(amp, device):
            logits = _segmentation_logits(net(images))
        logits, targets = upcast(logits), targets.long()  # masks may arrive as uint8
        if logits.shape[-2:] != targets.shape[-2:]:
            # Models here already answer at input size; this covers a mask kept at a different size.
            logits = F.interpolate(logits, size=targets.shape[-2:], mode="bilinear", align_corners=False)
        preds = logits.argmax(1)
        cm.update(preds, targets)
        valid = (targets != ignore_index).flatten(1).sum(1)
        if loss_fn is None:
            pixel_loss = F.cross_entropy(logits, targets, ignore_index=ignore_index, reduction="none").double()
        else:
            pixel_loss = _custom_loss(loss_fn, logits, targets)
        if pixel_loss.dim() == 0:  # a mean over valid pixels: spread it over them, so the sum is right
            per_image = pixel_loss * valid.double()
        else:
            per_image = pixel_loss.flatten(1).sum(1)
        loss_rows.append(torch.stack([indices.double(), per_image.cpu(), valid.double().cpu()], dim=1))
        if export is not None:
            masks.extend((int(i), p.to(torch.uint8).cpu()) for i, p in zip(indices, preds))
    local = torch.cat(loss_rows) if loss_rows else torch.zeros(0, 3, dtype=torch.float64)
    comm.all_reduce(cm.mat, "sum")  # int64: exact and independent of the summation order
    table = torch.cat(comm.all_gather_tensor(local))
    table = table[table[:, 0].argsort(stable=True)]
    _check_each_sample_once(table[:, 0].long(), loader)
    if export is not None:
        export_segmentation(Path(export), masks)  # collective: every rank sends, rank 0 writes
    valid_total = float(table[:, 2].sum())
    metrics = {"loss": float(table[:, 1].sum()) / valid_total if valid_total else math.nan}
    metrics.update(cm.compute(class_names))
    return metrics


def _check_each_sample_once(indices: torch.Tensor, loader: Any) -> None:
    """Raise when a sample was evaluated twice or skipped: the metrics would not be exact."""
    dataset = getattr(loader, "dataset", None)
    try:
        expected: int | None = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        expected = None
    check_each_index_once(indices.tolist(), expected, "validation samples",
                          "build the loader with src.data.build_eval_loader (not a padding DistributedSampler)")
