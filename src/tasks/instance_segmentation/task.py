"""Instance segmentation: per object a mask, a box and a class, with torchvision's Mask R-CNN
(src/models/mask_rcnn.py).

The models follow torchvision's protocol: in training `model(images, targets)` returns a dict of losses (summed
into the training loss), in evaluation `model(images)` returns per image {"boxes", "scores", "labels", "masks"
(probabilities [N, 1, H, W] in the input's pixels)}. Images are lists of float [3, H, W] tensors in 0..1; targets
lists of {"boxes": float [K, 4] xyxy, "labels": int64 [K] in 1..num_classes-1, "masks": uint8 [K, H, W]}.
Datasets: src/data/datasets/shapes/instance_segmentation.py.

Evaluation: COCO's own (pycocotools' COCOeval, src/evaluation/coco.py) of both iou types on one ground truth:
mask mAP@[.5:.95] (`mask_map`), mask mAP@.5 (`mask_map50`) and box mAP@[.5:.95] (`box_map`). Each rank encodes its
images' masks (RLE, masks.py) and keeps them with their boxes and COCO ground truth by dataset index; one
gather_object brings every image's to rank 0, sorted by index, the metrics are computed there on all of them in
that order (exactly what one process computes, for any world size) and broadcast to every rank.
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
from src.evaluation.coco import box_results, coco_metrics, ground_truth
from src.evaluation.exact import check_each_sample_once
from src.evaluation.protocol import EvalContext
from src.models.registry import INSTANCES
from src.precision import upcast
from src.tasks.base import MAX, Loss, Task
from src.tasks.detection.pictures import truth_tiles
from src.tasks.detection.task import detection_loss, refuse_list_batch_settings
from src.tasks.instance_segmentation.masks import binarise, encode, instance_truth, mask_results
from src.tasks.instance_segmentation.options import InstanceSegmentationPredict
from src.tasks.instance_segmentation.predictions import draw_instances, write_instances_json
from src.tasks.instance_segmentation.transforms import INSTANCE_SEGMENTATION_DATA
from src.tasks.pictures import TENSORBOARD_LONG_SIDE, dataset_class_names, fixed_sample_indices, unit_to_uint8
from src.tasks.registry import register_task

EACH_ONCE_HINT = "the loader must use EvalBatchSampler (src.data.build_eval_loader)"
PREDICTIONS_JSON = "predictions.json"
COCO_RESULTS_JSON = "coco_results.json"  # evaluate.py's export: the boxes COCOeval's "bbox" evaluation read
COCO_SEGM_RESULTS_JSON = "coco_segm_results.json"  # and the masks its "segm" evaluation read
MASKS_FOLDER = "masks"  # predict.py draw=true: the inputs with their masks drawn
PICTURE_SCORE = 0.3  # TensorBoard pictures draw the predictions scoring at least this

Row = tuple[int, dict[str, Any], CocoImageTruth]


def instances(prediction: dict[str, torch.Tensor]) -> dict[str, Any]:
    """One image's eval output on the CPU, its masks binarised and run-length encoded (masks.py)."""
    return {"boxes": upcast(prediction["boxes"].detach()).cpu().float().reshape(-1, 4),
            "scores": upcast(prediction["scores"].detach()).cpu().float().reshape(-1),
            "labels": prediction["labels"].detach().cpu().long().reshape(-1),
            "rles": encode(binarise(prediction["masks"].cpu()))}


class InstanceSegmentationEvaluator:
    """Per-image instances and ground truth, gathered once by index (see the module docstring)."""

    def __init__(self, context: EvalContext) -> None:
        if context.loss_fn is not None:
            raise ValueError("instance segmentation evaluation reports mAP; a loss_fn does not apply (the models "
                             "compute their losses only in training mode)")
        self.context = context
        self.rows: list[Row] = []

    def process(self, outputs: list[dict[str, torch.Tensor]], targets: Sequence[dict[str, Any]],
                indices: torch.Tensor) -> None:
        """One batch: the model's instances and the COCO ground truth of its images."""
        if len(outputs) != len(targets):
            raise ValueError(f"the model returned {len(outputs)} instance lists for {len(targets)} images")
        self.rows += [(int(i), instances(p), instance_truth(int(i), t, self.context.num_classes))
                      for i, p, t in zip(indices, outputs, targets)]

    def compute(self) -> dict[str, float]:
        """Every rank's rows gathered on rank 0, sorted by index, the metrics computed there once and broadcast."""
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
            raise RuntimeError(f"instance segmentation evaluation failed on rank 0: {value}")
        return value

    def _metrics(self, rows: list[Row]) -> dict[str, float]:
        """Rank 0: the exactly-once check, the exports, COCO's evaluation of all images, masks and boxes."""
        check_each_sample_once(torch.tensor([r[0] for r in rows], dtype=torch.int64), self.context.dataset_size)
        boxes = [result for _, prediction, truth in rows for result in box_results(truth, prediction)]
        masks = [result for _, prediction, truth in rows for result in mask_results(truth, prediction)]
        if self.context.export is not None:
            write_instances_json(self.context.export / PREDICTIONS_JSON, [str(r[0]) for r in rows],
                                 [r[1] for r in rows], self.context.class_names or [], key="index")
            # json writes each float's shortest exact repr: COCOeval on these files reads the very numbers used here.
            (self.context.export / COCO_RESULTS_JSON).write_text(json.dumps(boxes) + "\n")
            (self.context.export / COCO_SEGM_RESULTS_JSON).write_text(json.dumps(masks) + "\n")
        gt = ground_truth([r[2] for r in rows], self.context.class_names)
        segm, bbox = coco_metrics(gt, masks, "segm"), coco_metrics(gt, boxes, "bbox")
        return {"mask_map": segm["map"], "mask_map50": segm["map50"], "box_map": bbox["map"]}


class InstanceSegmentation(Task):
    """Images -> instances (mask, box, class); the model computes its own losses from the targets."""

    name = "instance_segmentation"
    model_output = INSTANCES  # the models it uses: those whose family produces this
    metrics = {"mask_map": MAX, "mask_map50": MAX, "box_map": MAX}
    data = INSTANCE_SEGMENTATION_DATA
    predict_options = InstanceSegmentationPredict
    exportable = False  # export_output says why

    def validate(self, config: Any) -> None:
        """What the instance-segmentation loop cannot do, refused before any process starts."""
        super().validate(config)
        refuse_list_batch_settings(config, self.name, "their boxes and masks",
                                   "Mask R-CNN's proposals, NMS and mask pasting")

    def forward(self, module: torch.nn.Module, images: Any, targets: Any) -> dict[str, torch.Tensor]:
        """torchvision's training protocol: the model's losses for these images, boxes and masks (lists)."""
        return module(images, targets)

    def loss(self, options: Any) -> Loss:
        """The sum of the model's losses (RPN, box and mask)."""
        return detection_loss

    def describe_output(self, outputs: Any) -> str:
        """Losses in training mode, instances per image in eval mode."""
        if isinstance(outputs, dict):
            return "losses " + ", ".join(f"{k}={float(v):.4f}" for k, v in outputs.items())
        return f"{[len(o['masks']) for o in outputs]} instances per image"

    def evaluator(self, context: EvalContext) -> InstanceSegmentationEvaluator:
        """mask_map, mask_map50, box_map (COCO's evaluation, src/evaluation/coco.py)."""
        return InstanceSegmentationEvaluator(context)

    def log_train_samples(self, writer: Any, images: Any, targets: Any, step: int, *, mean: Sequence[float],
                          std: Sequence[float]) -> None:
        """The first training images with their ground-truth masks and boxes."""
        grid = truth_tiles(images, targets)
        if grid is not None:
            writer.add_image("train/samples", grid, global_step=step, dataformats="CHW")

    def log_eval_pictures(self, writer: Any, model: Any, dataset: Any, step: int, device: torch.device, *,
                          mean: Sequence[float], std: Sequence[float], amp: str) -> None:
        """A few fixed validation images with their predicted masks and boxes scoring >= 0.3, drawn as predict.py
        draws them."""
        from src.precision import autocast, model_dtype
        from src.unwrap import eval_mode, unwrap_model

        net, names = unwrap_model(model), dataset_class_names(dataset)
        for n, index in enumerate(fixed_sample_indices(len(dataset), 4)):
            image = dataset[index][0]
            with eval_mode(net), torch.inference_mode(), autocast(amp, device):
                pred = instances(net([image.to(device, model_dtype(net))])[0])
            drawn = draw_instances(unit_to_uint8(image), pred, names, score_threshold=PICTURE_SCORE,
                                   min_long_side=TENSORBOARD_LONG_SIDE)
            writer.add_image(f"val/instances_{n}", drawn, global_step=step, dataformats="CHW")

    def predict(self, batches: Any, forward: Callable[[Any], Any], *, files: list[Path], out_dir: Path,
                class_names: list[str], batch_count: int, options: InstanceSegmentationPredict) -> Path:
        """out/predictions.json: one row per instance scoring at least `score_threshold`, its mask as COCO's RLE;
        with draw=true also out/masks/<input path>.png, each input enlarged with its masks and boxes (one instance per
        object unless draw_every_box=true)."""
        rows: list[tuple[int, dict[str, Any]]] = []
        for batch in batches:
            rows += [(int(i), instances(p)) for i, p in zip(batch.indices, forward(batch))]
            if options.draw:
                for image, i, (_, p) in zip(batch.images, batch.indices, rows[-batch.size:]):
                    target = out_dir / MASKS_FOLDER / files[int(i)].with_suffix(".png")
                    target.parent.mkdir(parents=True, exist_ok=True)
                    picture = draw_instances(unit_to_uint8(image), p, class_names,
                                             score_threshold=options.score_threshold, every_box=options.draw_every_box)
                    write_png(picture, str(target))
        gathered = sorted((r for part in comm.all_gather_object(rows) for r in part), key=lambda r: r[0])
        check_each_index_once([r[0] for r in gathered], len(files), "inputs", EACH_ONCE_HINT)
        path = out_dir / PREDICTIONS_JSON
        if comm.is_main_process():
            count = write_instances_json(path, [files[i].as_posix() for i, _ in gathered], [p for _, p in gathered],
                                         class_names, score_threshold=options.score_threshold)
            print(f"predicted {count} instance(s) in {len(gathered)} image(s) on {comm.get_world_size()} "
                  f"process(es): {path}", flush=True)
        return path

    def export_size(self, train_data: Any) -> int:
        """Refused: see the message."""
        raise ValueError("export.py does not export instance segmentation models: torchvision's Mask R-CNN takes a "
                         "list of images of any size and returns per image a number of instances (boxes and masks) "
                         "that depends on the data (score filtering and NMS), which the exported single-tensor "
                         "interface cannot express; use predict.py, or load the checkpoint's model in PyTorch")


INSTANCE_SEGMENTATION = register_task(InstanceSegmentation())
