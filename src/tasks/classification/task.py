"""Classification: one label per image; logits [N, K]; top-1 / top-5 accuracy.

Evaluation keeps one row per sample (index, loss, prediction, top-1 hit, top-5 hit) on each rank; the rows
of all ranks are gathered once, sorted by dataset index and reduced in that order. top1 and top5 are counts,
the same for any world size; the loss is the same sum in the same order, so it differs from a one-process
evaluation only where the per-sample losses do (float rounding of logits, which depends on batch
composition, thread count and CPU): within 1e-6 relative.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from src import comm
from src.data.samplers import check_each_index_once
from src.dataclass_config import section
from src.evaluation.exact import check_each_sample_once, custom_loss
from src.evaluation.protocol import EvalContext
from src.models.registry import IMAGE_LOGITS
from src.precision import upcast
from src.tasks.base import MAX, MIN, Loss, Task
from src.tasks.classification.exports import export_classification
from src.tasks.classification.metrics import topk_correct
from src.tasks.classification.mix import build_mix
from src.tasks.classification.options import ClassificationData, ClassificationPredict, ClassificationTraining
from src.tasks.classification.predictions import PREDICTIONS_CSV, write_predictions_csv
from src.tasks.classification.transforms import CLASSIFICATION_DATA, check_image_data
from src.tasks.registry import register_task

EACH_ONCE_HINT = "the loader must use EvalBatchSampler (src.data.build_eval_loader)"


def classification_loss(label_smoothing: float = 0.0) -> Loss:
    """Cross-entropy on logits [N, K]; targets are class indices or (MixUp/CutMix) probabilities [N, K].

    Computed in float32 at least (float64 logits stay float64), soft targets in the logits' dtype.
    """

    def loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = upcast(logits)
        if target.is_floating_point():
            target = target.to(logits.dtype)
        return F.cross_entropy(logits, target, label_smoothing=label_smoothing)

    return loss


class ClassificationEvaluator:
    """Per-sample rows, gathered and reduced in dataset order (see the module docstring)."""

    def __init__(self, context: EvalContext) -> None:
        self.context = context
        self.rows: list[torch.Tensor] = []  # per batch: [n, 5] float64 = index, loss, prediction, top-1, top-5

    def process(self, outputs: torch.Tensor, targets: torch.Tensor, indices: torch.Tensor) -> None:
        """One batch of logits."""
        logits, k = upcast(outputs), self.context.num_classes
        if logits.dim() != 2 or logits.shape[1] != k:
            raise ValueError(f"expected logits [N, {k}], got {tuple(logits.shape)}")
        if self.context.loss_fn is None:
            loss = F.cross_entropy(logits, targets, reduction="none").double()
        else:
            loss = custom_loss(self.context.loss_fn, logits, targets)
            if loss.dim() == 0:  # a batch mean: give each sample the mean, so the sum is right
                loss = loss.expand(len(targets))
        hits = topk_correct(logits, targets, (1, 5))
        self.rows.append(torch.stack([indices.double(), loss.cpu(), logits.argmax(1).double().cpu(),
                                      hits[:, 0].double().cpu(), hits[:, 1].double().cpu()], dim=1))

    def compute(self) -> dict[str, float]:
        """One gather of every rank's rows (uneven counts are fine), sorted by index: the one-process order."""
        local = torch.cat(self.rows) if self.rows else torch.zeros(0, 5, dtype=torch.float64)
        table = torch.cat(comm.all_gather_tensor(local))
        table = table[table[:, 0].argsort(stable=True)]
        check_each_sample_once(table[:, 0].long(), self.context.dataset_size)
        n = table.shape[0]
        if self.context.export is not None and comm.is_main_process():
            export_classification(self.context.export, table[:, 0].long(), table[:, 2].long())
        if n == 0:
            return {"loss": math.nan, "top1": math.nan, "top5": math.nan}
        return {
            "loss": float(table[:, 1].sum() / n),
            "top1": 100.0 * float(table[:, 3].sum()) / n,
            "top5": 100.0 * float(table[:, 4].sum()) / n,
        }


class Classification(Task):
    """Image -> class; MixUp / CutMix apply; TensorBoard shows the first training batch."""

    name = "classification"
    model_output = IMAGE_LOGITS  # the models it uses: those whose family produces this
    metrics = {"top1": MAX, "top5": MAX, "loss": MIN}
    data = CLASSIFICATION_DATA
    config_options = {"trainer": ClassificationTraining, "data": ClassificationData}
    predict_options = ClassificationPredict

    def validate(self, config: Any) -> None:
        """Its options, and the data keys its transforms read together (check_image_data)."""
        super().validate(config)
        check_image_data(config.data)

    def options(self, config: Any) -> ClassificationTraining:
        """trainer.label_smoothing, trainer.mixup_alpha, trainer.cutmix_alpha."""
        return section(config.trainer, ClassificationTraining)

    def loss(self, options: ClassificationTraining) -> Loss:
        """Cross-entropy with trainer.label_smoothing."""
        return classification_loss(options.label_smoothing)

    def batch_mix(self, options: ClassificationTraining, num_classes: int) -> Optional[Callable]:
        """MixUp / CutMix with trainer.mixup_alpha / trainer.cutmix_alpha (None when both are 0)."""
        return build_mix(options, num_classes)

    def evaluator(self, context: EvalContext) -> ClassificationEvaluator:
        """top1 / top5 in percent, the mean loss."""
        return ClassificationEvaluator(context)

    def log_train_samples(self, writer: Any, images: Any, targets: Any, step: int, *, mean: Sequence[float],
                          std: Sequence[float]) -> None:
        """A grid of up to 32 training images."""
        from src.tasks.classification.pictures import log_classification_grid

        log_classification_grid(writer, images[:32].cpu(), step, targets=targets[:32].cpu(), mean=list(mean),
                                std=list(std))

    def predict(self, batches: Any, forward: Callable[[Any], Any], *, files: list[Path], out_dir: Path,
                class_names: list[str], batch_count: int, options: ClassificationPredict) -> Path:
        """out/predictions.csv: per input, the `topk` classes and their softmax probabilities."""
        k = min(options.topk, len(class_names))
        rows: list[tuple[int, list[int], list[float]]] = []
        for batch in batches:
            probs = upcast(forward(batch)).softmax(dim=1)
            top = probs.topk(k, dim=1)
            rows += [(int(i), c.tolist(), p.tolist())
                     for i, c, p in zip(batch.indices, top.indices.cpu(), top.values.cpu())]
        gathered = sorted(r for part in comm.all_gather_object(rows) for r in part)
        check_each_index_once([r[0] for r in gathered], len(files), "inputs", EACH_ONCE_HINT)
        path = out_dir / PREDICTIONS_CSV
        if comm.is_main_process():
            write_predictions_csv(path, [files[i].as_posix() for i, _, _ in gathered],
                                  [[class_names[c] for c in cs] for _, cs, _ in gathered],
                                  [ps for _, _, ps in gathered])
            print(f"predicted {len(gathered)} image(s) on {comm.get_world_size()} process(es): {path}", flush=True)
        return path


CLASSIFICATION = register_task(Classification())
