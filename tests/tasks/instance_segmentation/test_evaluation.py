"""Instance segmentation evaluation is COCO's, of masks and boxes, and the same bits at any world size.

On the embedded shapes_inst with validation images of several sizes, evaluated on 1, 2 and 3 gloo ranks in batches
of 2 (shards and batches that no world size divides; Mask R-CNN pads each batch to its largest image):
- the metrics and the exported files are identical at every world size, byte for byte: a real Mask R-CNN
  (untrained, every instance kept) shows padding and thread count would change its outputs, and the ranks start
  with 1 or 2 CPU threads, as torchrun's defaults would differ;
- `mask_map`, `mask_map50` and `box_map` are pycocotools' COCOeval run directly on a ground-truth json written
  here from the dataset's targets (pycocotools' own RLE of each mask) and the exported results, within 1e-6;
- with `data=coco` (a COCO-format tree of nine sizes with polygons, run-length encodings, crowd regions, ids not
  contiguous and images without objects), they are COCOeval run directly on the original json.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pycocotools import mask as coco_mask
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from torch import nn

from src.config import data_config
from src.evaluation.loop import evaluate
from src.models import build_model
from src.tasks import get_task
from tests.support import process_state
from tests.support.coco_files import varied_coco, with_segmentations, write_coco_folder
from tests.support.gloo import run_on_ranks
from tests.support.task_data import build_datasets, build_eval_loader

WORLDS = (1, 2, 3)
SHAPES = dict(name="shapes_inst", train_size=2, val_size=7, image_size=40, num_classes=4, eval_batch_size=2,
              variable_val_size=True, min_shapes=2, max_shapes=4)
EXPORTED = ("predictions.json", "coco_results.json", "coco_segm_results.json")


class RememberedInstances(nn.Module):
    """A stand-in that remembers the validation images' instances and answers them spoiled: masks shifted by 0-2
    px (and their boxes with them), every third with the wrong class, plus a stray square; it looks each image up
    by its pixels, so its answer depends on the image alone (any rank, any batch)."""

    def __init__(self, dataset: Any) -> None:
        super().__init__()
        self.known = {}
        for i in range(len(dataset)):
            image, target = dataset[i]
            self.known[image.numpy().tobytes()] = (target["masks"].clone(), target["labels"].clone())

    def forward(self, images: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        out = []
        for image in images:
            masks, labels = self.known[image.numpy().tobytes()]
            h, w = image.shape[-2:]
            stray = torch.zeros(1, h, w, dtype=torch.uint8)
            stray[:, :9, :9] = 1
            k = torch.arange(len(masks))
            shifted = torch.cat([torch.roll(m, int(s), dims=1)[None] for m, s in zip(masks, k % 3)] + [stray])
            boxes = []
            for m in shifted:
                ys, xs = m.nonzero(as_tuple=True)
                boxes.append([float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)])
            out.append({"boxes": torch.tensor(boxes).reshape(-1, 4),
                        "scores": torch.cat([0.9 - 0.07 * k.float(), torch.tensor([0.85])]),
                        "labels": torch.cat([torch.where(k % 3 == 2, labels % 3 + 1, labels), torch.tensor([1])]),
                        "masks": shifted[:, None].float() * 0.8})
        return out


def tiny_mask_rcnn(num_classes: int) -> nn.Module:
    """An untrained Mask R-CNN on a ResNet-18 + FPN, the same weights in every process; every instance kept."""
    torch.manual_seed(0)
    model = build_model({"name": "maskrcnn_resnet18", "head_channels": 32}, {"name": "bn"}, num_classes)
    model.roi_heads.score_thresh = 0.0
    model.roi_heads.detections_per_img = 30
    return model.eval()


def _evaluate_all(rank: int, world: int, out: str, coco_root: str) -> dict[str, Any]:
    """Both models on shapes_inst and the stand-in on the COCO tree, with exports under out/<run>; runs on each
    rank."""
    torch.set_num_threads(1 + rank % 2)  # what each process had before: evaluation must not depend on it
    shapes = data_config(**SHAPES)
    coco = data_config(name="coco", root=coco_root, train_split="train", val_split="val", eval_batch_size=2)
    runs = {"remembered": (shapes, RememberedInstances), "maskrcnn": (shapes, lambda val: tiny_mask_rcnn(4)),
            "coco": (coco, RememberedInstances)}
    metrics = {}
    for name, (cfg, make_model) in runs.items():
        bundle = build_datasets(cfg, seed=0, task="instance_segmentation")
        loader = build_eval_loader(bundle.val, cfg, rank, world, task="instance_segmentation")
        metrics[name] = evaluate(make_model(bundle.val), loader, get_task("instance_segmentation"), bundle.num_classes, "cpu",
                                 export=Path(out) / name, class_names=bundle.class_names, threads=1)
    return {"metrics": metrics, "threads_after": torch.get_num_threads()}


@pytest.fixture(scope="module")
def coco_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The varied COCO-format folder with masks in each of COCO's forms (the same json for both splits)."""
    data = with_segmentations(varied_coco())
    return write_coco_folder(tmp_path_factory.mktemp("varied_coco"), data, data)


@pytest.fixture(scope="module")
def runs(coco_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[list[dict], Path]]:
    """world size -> (every rank's results, the export folder)."""
    done = {}
    for world in WORLDS:
        out = tmp_path_factory.mktemp(f"world{world}")
        done[world] = run_on_ranks(world, _evaluate_all, str(out), str(coco_root)), out
    return done


def _same(a: dict[str, float], b: dict[str, float]) -> bool:
    return a.keys() == b.keys() and all(a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in a)


def test_metrics_and_exports_are_the_same_bits_at_every_world_size(runs: dict) -> None:
    reference, ref_dir = runs[1][0][0]["metrics"], runs[1][1]
    rows = json.loads((ref_dir / "maskrcnn" / "coco_segm_results.json").read_text())
    assert len(rows) > 100 and len({r["score"] for r in rows}) > 100  # real outputs to compare
    for world, (results, out) in runs.items():
        for rank, result in enumerate(results):
            assert result["threads_after"] == 1 + rank % 2, "the process's thread count is restored"
            for name, metrics in result["metrics"].items():
                assert list(metrics) == ["mask_map", "mask_map50", "box_map"]
                assert _same(metrics, reference[name]), (world, rank, name, metrics, reference[name])
        for name in reference:
            for file in EXPORTED:
                assert (out / name / file).read_bytes() == (ref_dir / name / file).read_bytes(), (world, name, file)


def _ground_truth_json(path: Path) -> COCO:
    """shapes_inst's validation targets as a COCO json, written with pycocotools alone: RLE masks, their area."""
    bundle = build_datasets(data_config(**SHAPES), seed=0)
    images, annotations = [], []
    for i in range(len(bundle.val)):
        image, target = bundle.val[i]
        images.append({"id": i, "width": image.shape[2], "height": image.shape[1]})
        for (x1, y1, x2, y2), label, mask in zip(target["boxes"].tolist(), target["labels"].tolist(), target["masks"]):
            rle = coco_mask.encode(np.asfortranarray(mask.numpy()))
            annotations.append({"id": len(annotations) + 1, "image_id": i, "category_id": label,
                                "bbox": [x1, y1, x2 - x1, y2 - y1], "area": int(mask.sum()), "iscrowd": 0,
                                "segmentation": {"size": rle["size"], "counts": rle["counts"].decode()}})
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": [
        {"id": k, "name": n} for k, n in enumerate(bundle.class_names) if k]}))
    with contextlib.redirect_stdout(io.StringIO()):
        return COCO(str(path))


def _cocoeval(gt: COCO, results_file: Path, iou_type: str) -> list[float]:
    """pycocotools run directly, as its README does: AP@[.5:.95] and AP@.5."""
    with contextlib.redirect_stdout(io.StringIO()):
        evaluation = COCOeval(gt, gt.loadRes(str(results_file)), iou_type)
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    return evaluation.stats[:2].tolist()


def test_metrics_are_cocoeval_on_the_targets_and_the_exported_results(runs: dict, tmp_path: Path) -> None:
    gt = _ground_truth_json(tmp_path / "shapes_inst.json")
    for world, (results, out) in runs.items():
        for name in ("remembered", "maskrcnn"):
            mask_map, mask_map50 = _cocoeval(gt, out / name / "coco_segm_results.json", "segm")
            box_map = _cocoeval(gt, out / name / "coco_results.json", "bbox")[0]
            direct = {"mask_map": mask_map, "mask_map50": mask_map50, "box_map": box_map}
            assert results[0]["metrics"][name] == pytest.approx(direct, abs=1e-6), (world, name)
    remembered = runs[1][0][0]["metrics"]["remembered"]
    assert 0.2 < remembered["mask_map"] < remembered["mask_map50"] < 1  # a metric that can tell a wrong truth
    assert remembered["mask_map"] != pytest.approx(remembered["box_map"], abs=1e-3)  # masks, not boxes, scored
    rows = json.loads((runs[1][1] / "remembered" / "predictions.json").read_text())
    assert sorted({r["index"] for r in rows}, key=int) == [str(i) for i in range(SHAPES["val_size"])]
    assert {"class", "score", "x1", "y1", "x2", "y2", "segmentation"} <= set(rows[0])


def test_coco_masks_are_cocoeval_on_the_original_json_at_every_world_size(runs: dict, coco_root: Path) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(coco_root / "annotations" / "instances_val.json"))
    for world, (results, out) in runs.items():
        rows = json.loads((out / "coco" / "coco_segm_results.json").read_text())
        assert {r["image_id"] for r in rows} == set(gt.getImgIds()) and {r["category_id"] for r in rows} <= {3, 7, 12}
        mask_map, mask_map50 = _cocoeval(gt, out / "coco" / "coco_segm_results.json", "segm")
        box_map = _cocoeval(gt, out / "coco" / "coco_results.json", "bbox")[0]
        direct = {"mask_map": mask_map, "mask_map50": mask_map50, "box_map": box_map}
        assert results[0]["metrics"]["coco"] == pytest.approx(direct, abs=1e-6), (world, direct)
    coco = runs[1][0][0]["metrics"]["coco"]
    assert 0.2 < coco["mask_map"] < coco["mask_map50"] < 1  # a metric that can tell a wrong ground truth


def test_one_process_without_a_group_matches_too(runs: dict, coco_root: Path, tmp_path: Path) -> None:
    with process_state.restoring("torch intra-op threads", "torch's global RNG"):
        alone = _evaluate_all(0, 1, str(tmp_path), str(coco_root))
    assert all(_same(alone["metrics"][k], v) for k, v in runs[1][0][0]["metrics"].items())
