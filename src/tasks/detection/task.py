"""Object detection: boxes and classes per image, with torchvision's detection models (FCOS, RetinaNet, ...).

The models follow torchvision's protocol: in training `model(images, targets)` returns a dict of losses
(summed into the training loss), in evaluation `model(images)` returns per image {"boxes" (xyxy, in the
input's pixels), "scores", "labels"}. Images are lists of float [3, H, W] tensors in 0..1 (the model resizes
and normalises them itself); targets are lists of {"boxes": float [K, 4] xyxy, "labels": int64 [K]} with
labels 1..num_classes-1 (0 is the background). Datasets: src/data/datasets/shapes/detection.py and coco.py.

Evaluation: COCO's own (pycocotools' COCOeval on COCO's ground truth, src/evaluation/coco.py): mAP@[.5:.95]
(`map`), mAP@.5 (`map50`) and mAP@.75 (`map75`). Each rank keeps its images' detections and COCO ground truth
by dataset index; one gather_object brings every image's to rank 0, sorted by index, the metric is computed
there on all of them in that order (exactly what one process computes, for any world size) and broadcast to
every rank.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torchvision.io import write_png

from src import comm
from src.data.coco_annotations import CocoImageTruth
from src.data.samplers import check_each_index_once
from src.evaluation.coco import box_results, coco_metrics, ground_truth, image_truth
from src.evaluation.exact import check_each_sample_once
from src.evaluation.protocol import EvalContext
from src.models.registry import DETECTIONS
from src.precision import upcast
from src.tasks.base import MAX, Loss, Task
from src.tasks.detection.options import DetectionPredict
from src.tasks.detection.pictures import detection_picture, truth_tiles
from src.tasks.detection.transforms import DETECTION_DATA
from src.tasks.pictures import TENSORBOARD_LONG_SIDE, dataset_class_names, fixed_sample_indices, unit_to_uint8
from src.tasks.registry import register_task

EACH_ONCE_HINT = "the loader must use EvalBatchSampler (src.data.build_eval_loader)"
PREDICTIONS_JSON = "predictions.json"
COCO_RESULTS_JSON = "coco_results.json"  # evaluate.py's export: the detections COCOeval read, in its format
BOXES_FOLDER = "boxes"  # predict.py draw=true: the inputs with their boxes drawn
PICTURE_SCORE = 0.3  # TensorBoard pictures draw the predictions scoring at least this


def _cpu_prediction(prediction: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {"boxes": upcast(prediction["boxes"].detach()).cpu().float().reshape(-1, 4),
            "scores": upcast(prediction["scores"].detach()).cpu().float().reshape(-1),
            "labels": prediction["labels"].detach().cpu().long().reshape(-1)}


def detection_loss(losses: dict[str, torch.Tensor], targets: Any = None) -> torch.Tensor:
    """The sum of the model's losses (classification, box regression, centerness, ...), in float32 at least."""
    if not isinstance(losses, dict) or not losses:
        raise ValueError("a detection model must return a dict of losses in training mode (torchvision's "
                         f"protocol: model(images, targets)), got {type(losses).__name__}")
    return sum(upcast(v) for v in losses.values())


class DetectionEvaluator:
    """Per-image predictions and ground truth, gathered once by index (see the module docstring)."""

    def __init__(self, context: EvalContext) -> None:
        if context.loss_fn is not None:
            raise ValueError("detection evaluation reports mAP; a loss_fn does not apply (the models compute "
                             "their losses only in training mode)")
        self.context = context
        self.rows: list[tuple[int, dict[str, torch.Tensor], CocoImageTruth]] = []

    def process(self, outputs: list[dict[str, torch.Tensor]], targets: Sequence[dict[str, Any]],
                indices: torch.Tensor) -> None:
        """One batch: the model's detections and the COCO ground truth of its images."""
        if len(outputs) != len(targets):
            raise ValueError(f"the model returned {len(outputs)} detection lists for {len(targets)} images")
        self.rows += [(int(i), _cpu_prediction(p), image_truth(int(i), t, self.context.num_classes))
                      for i, p, t in zip(indices, outputs, targets)]

    def compute(self) -> dict[str, float]:
        """Every rank's rows gathered on rank 0, sorted by index, the mAP computed there once and broadcast: the
        same dict on every rank (COCO's evaluation is seconds to minutes of CPU; no rank repeats it)."""
        parts = comm.gather_object(self.rows)
        outcome: tuple[str, Any] = ("ok", None)
        failure: Exception | None = None
        if parts is not None:
            try:
                outcome = ("ok", self._metrics(sorted((r for part in parts for r in part), key=lambda r: r[0])))
            except Exception as err:  # the other ranks wait in the broadcast: they get the error, not a hang
                failure, outcome = err, ("error", f"{type(err).__name__}: {err}")
        kind, value = comm.broadcast_object(outcome)
        if failure is not None:
            raise failure
        if kind == "error":
            raise RuntimeError(f"detection evaluation failed on rank 0: {value}")
        return value

    def _metrics(self, rows: list[tuple[int, dict[str, torch.Tensor], CocoImageTruth]]) -> dict[str, float]:
        """Rank 0: the exactly-once check, the export, COCO's evaluation of all images."""
        check_each_sample_once(torch.tensor([r[0] for r in rows], dtype=torch.int64), self.context.dataset_size)
        results = [result for _, prediction, truth in rows for result in box_results(truth, prediction)]
        if self.context.export is not None:
            write_predictions_json(self.context.export / PREDICTIONS_JSON, [str(r[0]) for r in rows],
                                   [r[1] for r in rows], self.context.class_names or [], key="index")
            # json writes each float's shortest exact repr: COCOeval on this file reads the very numbers used here.
            (self.context.export / COCO_RESULTS_JSON).write_text(json.dumps(results) + "\n")
        metrics = coco_metrics(ground_truth([r[2] for r in rows], self.context.class_names), results, "bbox")
        return {name: metrics[name] for name in Detection.metrics}


def write_predictions_json(path: Path, names: list[str], predictions: list[dict[str, torch.Tensor]],
                           class_names: list[str], *, key: str = "file", score_threshold: float = 0.0) -> int:
    """One JSON row per box: {key: name, "class", "score", "x1", "y1", "x2", "y2"} (pixels of the image);
    returns the number of rows."""
    rows = []
    for name, p in zip(names, predictions):
        for box, score, label in zip(p["boxes"].tolist(), p["scores"].tolist(), p["labels"].tolist()):
            if score >= score_threshold:
                cls = class_names[label] if 0 <= label < len(class_names) else str(label)
                rows.append({key: name, "class": cls, "score": round(score, 6),
                             **{c: round(v, 2) for c, v in zip(("x1", "y1", "x2", "y2"), box)}})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, indent=1) + "\n")
    return len(rows)


def refuse_list_batch_settings(config: Any, task: str, targets: str, dynamic: str) -> None:
    """Refuse, before any process starts, what a task of torchvision-style detectors (lists of images of their own
    sizes, the model computing its own losses) cannot do; `targets`/`dynamic` name what its batches carry and
    what has data-dependent shapes, for the messages."""
    trainer = config.trainer
    refused = [
        (trainer.channels_last, "trainer.channels_last=true",
         "the images are a list of differently sized tensors that the model batches itself"),
        (config.data.device_transforms is True, "data.device_transforms=true",
         f"the training batches are lists of images with {targets} (set data.device_transforms=auto or false)"),
        (trainer.precise_bn_batches > 0, f"trainer.precise_bn_batches={trainer.precise_bn_batches}",
         f"its training-mode forward needs each batch's {targets.removeprefix('their ')}"),
        (trainer.compile, "trainer.compile=true", f"{dynamic} have data-dependent shapes"),
        (trainer.activation_checkpointing, "trainer.activation_checkpointing=true",
         "its stages are not known to the trainer"),
    ]
    for on, key, why in refused:
        if on:
            raise ValueError(f"{key} does not apply to {task}: {why}; remove it")


class Detection(Task):
    """Images -> boxes with classes; the model computes its own losses from the targets."""

    name = "detection"
    model_output = DETECTIONS  # the models it uses: those whose family produces this
    metrics = {"map": MAX, "map50": MAX, "map75": MAX}
    data = DETECTION_DATA
    predict_options = DetectionPredict
    exportable = False  # export_output says why

    def validate(self, config: Any) -> None:
        """What the detection loop cannot do, refused before any process starts."""
        super().validate(config)
        refuse_list_batch_settings(config, self.name, "their boxes", "the detectors' box decoding and NMS")

    def forward(self, module: torch.nn.Module, images: Any, targets: Any) -> dict[str, torch.Tensor]:
        """torchvision's training protocol: the model's losses for these images and boxes (lists)."""
        return module(images, targets)

    def loss(self, options: Any) -> Loss:
        """The sum of the model's losses."""
        return detection_loss

    def describe_output(self, outputs: Any) -> str:
        """Losses in training mode, detections per image in eval mode."""
        if isinstance(outputs, dict):
            return "losses " + ", ".join(f"{k}={float(v):.4f}" for k, v in outputs.items())
        return f"{[len(o['boxes']) for o in outputs]} boxes per image"

    def evaluator(self, context: EvalContext) -> DetectionEvaluator:
        """map, map50, map75 (COCO's evaluation, src/evaluation/coco.py)."""
        return DetectionEvaluator(context)

    def log_train_samples(self, writer: Any, images: Any, targets: Any, step: int, *, mean: Sequence[float],
                          std: Sequence[float]) -> None:
        """The first training images with their ground-truth boxes."""
        grid = truth_tiles(images, targets)
        if grid is not None:
            writer.add_image("train/samples", grid, global_step=step, dataformats="CHW")

    def log_eval_pictures(self, writer: Any, model: Any, dataset: Any, step: int, device: torch.device, *,
                          mean: Sequence[float], std: Sequence[float], amp: str) -> None:
        """A few fixed validation images: ground truth (white) under the predictions scoring >= 0.3, drawn as
        predict.py draws them (one box per object, class colours, labels, legend)."""
        from src.precision import autocast, model_dtype
        from src.unwrap import eval_mode, unwrap_model

        net, names = unwrap_model(model), dataset_class_names(dataset)
        for n, index in enumerate(fixed_sample_indices(len(dataset), 4)):
            image, target = dataset[index][:2]
            with eval_mode(net), torch.inference_mode(), autocast(amp, device):
                pred = _cpu_prediction(net([image.to(device, model_dtype(net))])[0])
            drawn = detection_picture(unit_to_uint8(image), pred, names, score_threshold=PICTURE_SCORE,
                                      truth=target["boxes"], min_long_side=TENSORBOARD_LONG_SIDE)
            writer.add_image(f"val/detections_{n}", drawn, global_step=step, dataformats="CHW")

    def predict(self, batches: Any, forward: Callable[[Any], Any], *, files: list[Path], out_dir: Path,
                class_names: list[str], batch_count: int, options: DetectionPredict) -> Path:
        """out/predictions.json: one row per box scoring at least `score_threshold`; with draw=true also
        out/boxes/<input path>.png, each input enlarged with its boxes (pictures.py: one per object unless
        draw_every_box=true)."""
        draw, score_threshold = options.draw, options.score_threshold
        rows: list[tuple[int, dict[str, torch.Tensor]]] = []
        for batch in batches:
            rows += [(int(i), _cpu_prediction(p)) for i, p in zip(batch.indices, forward(batch))]
            if draw:
                for image, i, (_, p) in zip(batch.images, batch.indices, rows[-batch.size:]):
                    picture = detection_picture(unit_to_uint8(image), p, class_names, score_threshold=score_threshold,
                                                every_box=options.draw_every_box)
                    target = out_dir / BOXES_FOLDER / files[int(i)].with_suffix(".png")
                    target.parent.mkdir(parents=True, exist_ok=True)
                    write_png(picture, str(target))
        gathered = sorted((r for part in comm.all_gather_object(rows) for r in part), key=lambda r: r[0])
        check_each_index_once([r[0] for r in gathered], len(files), "inputs", EACH_ONCE_HINT)
        path = out_dir / PREDICTIONS_JSON
        if comm.is_main_process():
            count = write_predictions_json(path, [files[i].as_posix() for i, _ in gathered], [p for _, p in gathered],
                                           class_names, score_threshold=score_threshold)
            print(f"predicted {count} box(es) in {len(gathered)} image(s) on {comm.get_world_size()} process(es): "
                  f"{path}", flush=True)
        return path

    def export_size(self, train_data: Any) -> int:
        """Refused: see the message."""
        raise ValueError("export.py does not export detection models: torchvision's detectors take a list of "
                         "images of any size and return per image a number of boxes that depends on the data "
                         "(score filtering and NMS), which the exported single-tensor interface cannot express; "
                         "use predict.py, or load the checkpoint's model in PyTorch")


DETECTION = register_task(Detection())
