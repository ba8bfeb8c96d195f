"""Multi-label classification: any number of labels per image; logits [N, K], one independent score per class;
mean average precision.

It reuses classification's models (every family producing per-image logits), its transforms and its `data` keys;
what differs is here: the target is a multi-hot float [K], the loss binary cross-entropy on each class's logit,
the metric the average precision of each class (`ap_<class>`) and their mean (`map`), predict.py's labels those
whose probability reaches a threshold.

Evaluation keeps one row per sample (index, its loss, its K logits and K targets, float64) on each rank; the rows
of all ranks are gathered once and sorted by dataset index, and every rank computes the metrics from that one
table (src/tasks/multilabel/metrics.py): each sample's logits are the same bits at any world size (the evaluation
batches are fixed blocks of indices, one thread count), so the APs and their mean are too, and the loss is the
same sum in the same order.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from src import comm
from src.data.samplers import check_each_index_once
from src.evaluation.exact import check_each_sample_once, custom_loss, metric_name
from src.evaluation.protocol import EvalContext
from src.models.registry import IMAGE_LOGITS
from src.precision import upcast
from src.tasks.base import MAX, MIN, Loss, Task
from src.tasks.classification.options import ClassificationData
from src.tasks.classification.transforms import check_image_data
from src.tasks.multilabel.metrics import average_precisions, mean_average_precision
from src.tasks.multilabel.options import MultiLabelPredict
from src.tasks.multilabel.predictions import PREDICTIONS_CSV, PROBABILITIES_NPY, write_predictions_csv
from src.tasks.multilabel.transforms import MULTILABEL_DATA
from src.tasks.registry import register_task

EACH_ONCE_HINT = "the loader must use EvalBatchSampler (src.data.build_eval_loader)"
EXPORT_THRESHOLD = 0.5  # evaluate.py's export lists the labels of probability >= this (predict.py: threshold=)


def multilabel_loss() -> Loss:
    """Binary cross-entropy with logits [N, K] against multi-hot targets [N, K], the mean over samples and classes,
    in float32 at least (float64 logits stay float64)."""

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = upcast(logits)
        return F.binary_cross_entropy_with_logits(logits, targets.to(logits.dtype))

    return loss


def _check_shapes(logits: torch.Tensor, targets: torch.Tensor, k: int) -> None:
    if logits.dim() != 2 or logits.shape[1] != k:
        raise ValueError(f"expected logits [N, {k}], got {tuple(logits.shape)}")
    if targets.shape != logits.shape:
        raise ValueError(f"expected multi-hot targets [N, {k}] like the logits, got {tuple(targets.shape)} (a "
                         "multi-label dataset gives each image a float [K] vector: 1 for each of its classes)")


class MultiLabelEvaluator:
    """Per-sample rows, gathered and reduced in dataset order (see the module docstring)."""

    def __init__(self, context: EvalContext) -> None:
        self.context = context
        self.rows: list[torch.Tensor] = []  # per batch: [n, 2 + 2K] float64 = index, loss, K logits, K targets

    def process(self, outputs: torch.Tensor, targets: torch.Tensor, indices: torch.Tensor) -> None:
        """One batch of logits and multi-hot targets."""
        logits, k = upcast(outputs), self.context.num_classes
        _check_shapes(logits, targets, k)
        truth = targets.to(logits.dtype)
        if self.context.loss_fn is None:
            loss = F.binary_cross_entropy_with_logits(logits, truth, reduction="none").double().mean(1)
        else:  # per sample and class [N, K], per sample [N], or a batch mean (each sample gets it)
            loss = custom_loss(self.context.loss_fn, logits, truth)
            if loss.dim() == 2:
                loss = loss.mean(1)
            elif loss.dim() == 0:
                loss = loss.expand(len(truth))
        self.rows.append(torch.cat([indices.double().view(-1, 1), loss.cpu().view(-1, 1), logits.double().cpu(),
                                    truth.double().cpu()], dim=1))

    def compute(self) -> dict[str, float]:
        """One gather of every rank's rows (uneven counts are fine), sorted by index: the one-process order."""
        k = self.context.num_classes
        local = torch.cat(self.rows) if self.rows else torch.zeros(0, 2 + 2 * k, dtype=torch.float64)
        table = torch.cat(comm.all_gather_tensor(local))
        table = table[table[:, 0].argsort(stable=True)]
        check_each_sample_once(table[:, 0].long(), self.context.dataset_size)
        logits, truth = table[:, 2:2 + k].numpy(), table[:, 2 + k:].numpy()
        if self.context.export is not None and comm.is_main_process():
            self._export(table[:, 0].long().tolist(), logits)
        names = self.context.class_names or [str(c) for c in range(k)]
        aps = average_precisions(logits, truth)
        n = table.shape[0]
        return {"map": mean_average_precision(aps), "loss": float(table[:, 1].sum() / n) if n else math.nan,
                **{f"ap_{metric_name(name)}": float(ap) for name, ap in zip(names, aps)}}

    def _export(self, indices: list[int], logits: np.ndarray) -> None:
        """evaluate.py export=DIR: probabilities.npy (float32 [N, K]) and predictions.csv, in dataset order."""
        out = self.context.export
        probs = torch.from_numpy(logits).sigmoid().numpy()
        out.mkdir(parents=True, exist_ok=True)
        np.save(out / PROBABILITIES_NPY, probs.astype(np.float32))
        names = self.context.class_names or [str(c) for c in range(probs.shape[1])]
        write_predictions_csv(out / PREDICTIONS_CSV, "index", [str(i) for i in indices], probs, names,
                              EXPORT_THRESHOLD)


class MultiLabel(Task):
    """Image -> the set of classes it shows; TensorBoard shows the first training batch."""

    name = "multilabel"
    model_output = IMAGE_LOGITS  # classification's models: one logit per class and image
    metrics = {"map": MAX, "loss": MIN}
    per_class_prefix = "ap_"
    data = MULTILABEL_DATA
    config_options = {"data": ClassificationData}  # classification's transforms, so its keys (one key each)
    predict_options = MultiLabelPredict

    def validate(self, config: Any) -> None:
        """Its options, and the data keys classification's transforms read together."""
        super().validate(config)
        check_image_data(config.data)

    def loss(self, options: Any) -> Loss:
        """Binary cross-entropy on every class's logit."""
        return multilabel_loss()

    def evaluator(self, context: EvalContext) -> MultiLabelEvaluator:
        """map and ap_<class> (0-1), the mean loss."""
        return MultiLabelEvaluator(context)

    def log_train_samples(self, writer: Any, images: Any, targets: Any, step: int, *, mean: Sequence[float],
                          std: Sequence[float]) -> None:
        """A grid of up to 32 training images."""
        from src.tasks.classification.pictures import log_classification_grid

        log_classification_grid(writer, images[:32].cpu(), step, mean=list(mean), std=list(std))

    def predict(self, batches: Any, forward: Callable[[Any], Any], *, files: list[Path], out_dir: Path,
                class_names: list[str], batch_count: int, options: MultiLabelPredict) -> Path:
        """out/predictions.csv: per input, the labels of probability >= `threshold` and every class's probability."""
        rows: list[tuple[int, list[float]]] = []
        for batch in batches:
            probs = upcast(forward(batch)).sigmoid().cpu()
            rows += [(int(i), p.tolist()) for i, p in zip(batch.indices, probs)]
        gathered = sorted(r for part in comm.all_gather_object(rows) for r in part)
        check_each_index_once([r[0] for r in gathered], len(files), "inputs", EACH_ONCE_HINT)
        path = out_dir / PREDICTIONS_CSV
        if comm.is_main_process():
            probs = np.array([p for _, p in gathered], dtype=np.float64).reshape(len(gathered), len(class_names))
            write_predictions_csv(path, "file", [files[i].as_posix() for i, _ in gathered], probs, class_names,
                                  options.threshold)
            print(f"predicted {len(gathered)} image(s) on {comm.get_world_size()} process(es): {path}", flush=True)
        return path


MULTILABEL = register_task(MultiLabel())
