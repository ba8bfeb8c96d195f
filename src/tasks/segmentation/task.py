"""Segmentation: a class per pixel; the model returns logits [N, K, H, W] (or DeepLab's {"out", "aux"}).

Evaluation: each rank sums an int64 confusion matrix (exact, order-free), all_reduced once; the loss is
gathered per image (sum over valid pixels, count) and summed in dataset order. Metrics: miou, pixel_acc and
iou_<class> (0-1; a class absent from both ground truth and predictions has iou NaN and is left out of miou).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torchvision.io import write_png

from src import comm
from src.data.samplers import check_each_index_once
from src.data.segmentation.masks import IGNORE_INDEX
from src.data.segmentation.palette import save_mask_png
from src.evaluation.exact import check_each_sample_once, custom_loss
from src.evaluation.protocol import EvalContext
from src.models.registry import PIXEL_LOGITS
from src.precision import upcast
from src.tasks.base import MAX, MIN, Loss, Task
from src.tasks.pictures import to_uint8_image
from src.tasks.registry import register_task
from src.tasks.segmentation.exports import export_segmentation, gather_masks
from src.tasks.segmentation.metrics import ConfusionMatrix
from src.tasks.segmentation.options import (SegmentationData, SegmentationOptions, SegmentationPredict,
                                            SegmentationPredictSettings)
from src.tasks.segmentation.predictions import OVERLAYS_FOLDER, mask_names, overlay_names
from src.tasks.segmentation.transforms import SEGMENTATION_DATA

EACH_ONCE_HINT = "the loader must use EvalBatchSampler (src.data.build_eval_loader)"


def segmentation_logits(output: Any) -> torch.Tensor:
    """The main head's logits: output["out"] for DeepLab-style dict outputs, else the tensor itself."""
    if isinstance(output, dict):
        if "out" not in output:
            raise ValueError(f"segmentation model returned keys {sorted(output)}, expected 'out'")
        return output["out"]
    return output


def segmentation_loss(ignore_index: int = IGNORE_INDEX, aux_weight: float = 0.0) -> Loss:
    """Per-pixel CE ignoring `ignore_index`, plus aux_weight x CE of the auxiliary head when present.

    The mean is over the labelled pixels of the micro-batch (F.cross_entropy's convention).
    """

    def loss(outputs: Any, target: torch.Tensor) -> torch.Tensor:
        total = F.cross_entropy(upcast(segmentation_logits(outputs)), target, ignore_index=ignore_index)
        if aux_weight > 0 and isinstance(outputs, dict) and "aux" in outputs:
            total = total + aux_weight * F.cross_entropy(upcast(outputs["aux"]), target, ignore_index=ignore_index)
        return total

    return loss


class SegmentationEvaluator:
    """A confusion matrix and per-image losses (see the module docstring)."""

    def __init__(self, context: EvalContext) -> None:
        self.context = context
        self.cm = ConfusionMatrix(context.num_classes, IGNORE_INDEX, device=context.device)
        self.loss_rows: list[torch.Tensor] = []  # per image: index, loss summed over valid pixels, valid pixels
        self.masks: list[tuple[int, torch.Tensor]] = []  # (index, uint8 prediction), kept only when exporting

    def process(self, outputs: Any, targets: torch.Tensor, indices: torch.Tensor) -> None:
        """One batch of logits (any size: resized to the masks')."""
        ignore = IGNORE_INDEX
        logits, targets = upcast(segmentation_logits(outputs)), targets.long()  # masks may arrive as uint8
        if logits.shape[-2:] != targets.shape[-2:]:
            # Models here already answer at input size; this covers a mask kept at a different size.
            logits = F.interpolate(logits, size=targets.shape[-2:], mode="bilinear", align_corners=False)
        preds = logits.argmax(1)
        self.cm.update(preds, targets)
        valid = (targets != ignore).flatten(1).sum(1)
        if self.context.loss_fn is None:
            pixel_loss = F.cross_entropy(logits, targets, ignore_index=ignore, reduction="none").double()
        else:
            pixel_loss = custom_loss(self.context.loss_fn, logits, targets)
        if pixel_loss.dim() == 0:  # a mean over valid pixels: spread it over them, so the sum is right
            per_image = pixel_loss * valid.double()
        else:
            per_image = pixel_loss.flatten(1).sum(1)
        self.loss_rows.append(torch.stack([indices.double(), per_image.cpu(), valid.double().cpu()], dim=1))
        if self.context.export is not None:
            self.masks.extend((int(i), p.to(torch.uint8).cpu()) for i, p in zip(indices, preds))

    def compute(self) -> dict[str, float]:
        """One all_reduce of the matrix, one gather of the loss rows (and the masks' rounds when exporting)."""
        local = torch.cat(self.loss_rows) if self.loss_rows else torch.zeros(0, 3, dtype=torch.float64)
        comm.all_reduce(self.cm.mat, "sum")  # int64: exact and independent of the summation order
        table = torch.cat(comm.all_gather_tensor(local))
        table = table[table[:, 0].argsort(stable=True)]
        check_each_sample_once(table[:, 0].long(), self.context.dataset_size)
        if self.context.export is not None:
            export_segmentation(self.context.export, self.masks)  # collective: every rank sends, rank 0 writes
        valid_total = float(table[:, 2].sum())
        metrics = {"loss": float(table[:, 1].sum()) / valid_total if valid_total else math.nan}
        metrics.update(self.cm.compute(self.context.class_names))
        return metrics


class Segmentation(Task):
    """Image -> mask; TensorBoard shows image | truth | prediction panels after each evaluation."""

    name = "segmentation"
    model_output = PIXEL_LOGITS  # the models it uses: those whose family produces this
    metrics = {"miou": MAX, "pixel_acc": MAX, "loss": MIN}
    per_class_prefix = "iou_"
    data = SEGMENTATION_DATA
    config_options = {"data": SegmentationData}
    predict_options = SegmentationPredict

    def options(self, config: Any) -> SegmentationOptions:
        """The auxiliary head's loss weight (model.aux_loss_weight of the models that have one)."""
        return SegmentationOptions(aux_weight=float(getattr(config.model, "aux_loss_weight", 0.0) or 0.0))

    def loss(self, options: SegmentationOptions) -> Loss:
        """Per-pixel cross-entropy (plus model.aux_loss_weight x the auxiliary head's)."""
        return segmentation_loss(IGNORE_INDEX, options.aux_weight)

    def describe_output(self, outputs: Any) -> str:
        """The main head's logits shape."""
        return str(tuple(segmentation_logits(outputs).shape))

    def evaluator(self, context: EvalContext) -> SegmentationEvaluator:
        """miou, pixel_acc, iou_<class> and the mean loss over labelled pixels."""
        return SegmentationEvaluator(context)

    def log_eval_pictures(self, writer: Any, model: Any, dataset: Any, step: int, device: torch.device, *,
                          mean: Sequence[float], std: Sequence[float], amp: str) -> None:
        """image | truth | prediction rows of a few fixed validation images."""
        from src.tasks.segmentation.pictures import log_segmentation_panels

        log_segmentation_panels(writer, model, dataset, step, device, mean=mean, std=std, ignore_index=IGNORE_INDEX,
                                amp=amp)

    def predict_settings(self, cfg: Any, config: Any = None) -> SegmentationPredictSettings:
        """draw, and the trained run's data.mean / data.std (its inputs are drawn as they were, not normalised)."""
        options = super().predict_settings(cfg)
        data = getattr(config, "data", None)
        return SegmentationPredictSettings(draw=options.draw, mean=tuple(getattr(data, "mean", (0.0,) * 3)),
                                           std=tuple(getattr(data, "std", (1.0,) * 3)))

    def predict_batch_size(self, requested: int) -> int:
        """One image per batch: each is predicted at its own size."""
        return 1

    def predict(self, batches: Any, forward: Callable[[Any], Any], *, files: list[Path], out_dir: Path,
                class_names: list[str], batch_count: int, options: Any) -> Path:
        """One palette PNG per input (pixel value = class); masks reach rank 0 in rounds (gather_masks). With
        draw=true each rank also writes its inputs' overlays, out/overlays/<input path>.png (pictures.py)."""
        targets = mask_names(files)
        drawn = overlay_names(files) if options is not None and options.draw else None

        def masks() -> Iterator[tuple[int, np.ndarray]]:
            for batch in batches:
                pred = upcast(segmentation_logits(forward(batch))).argmax(dim=1).to(torch.uint8).cpu()
                if drawn is not None:
                    for image, i, mask in zip(batch.images, batch.indices, pred):
                        _write_overlay(out_dir / drawn[int(i)], to_uint8_image(image, options.mean, options.std),
                                       mask, class_names)
                yield from ((int(i), m.numpy()) for i, m in zip(batch.indices, pred))

        def write(index: int, mask: np.ndarray) -> None:
            path = out_dir / targets[index]
            path.parent.mkdir(parents=True, exist_ok=True)
            save_mask_png(path, mask)

        seen = gather_masks(masks(), batch_count, write)
        check_each_index_once(seen, len(files), "inputs", EACH_ONCE_HINT)
        if comm.is_main_process():
            legend = ", ".join(f"{i}={n}" for i, n in enumerate(class_names))
            overlays = f"; overlays under {out_dir / OVERLAYS_FOLDER}" if drawn is not None else ""
            print(f"predicted {len(seen)} mask(s) on {comm.get_world_size()} process(es) under {out_dir} "
                  f"(palette PNGs, pixel value = class: {legend}){overlays}", flush=True)
        return out_dir

    def export_output(self, outputs: Any) -> torch.Tensor:
        """The main head's logits (the auxiliary head is a training device)."""
        return segmentation_logits(outputs)

    def export_size(self, train_data: Any) -> int:
        """The training crop."""
        return int(train_data.crop_size)


SEGMENTATION = register_task(Segmentation())


def _write_overlay(path: Path, pixels: torch.Tensor, mask: torch.Tensor, class_names: list[str]) -> None:
    from src.tasks.segmentation.pictures import segmentation_overlay

    path.parent.mkdir(parents=True, exist_ok=True)
    write_png(segmentation_overlay(pixels, mask, class_names), str(path))
