"""Detection evaluation is COCO's and the same bits at any world size.

On a COCO-format folder (tests/support/coco_files.varied_coco: nine images of nine sizes, crowd regions,
boxes under a pixel or of zero width, non-contiguous image and category ids, images without objects) and on
the embedded shapes_det, evaluated on 1, 2 and 3 gloo ranks in batches of 2 (shards and batches that no world
size divides; a detector pads each batch to its largest image):
- the metrics and the exported files are identical at every world size, byte for byte: a real FCOS
  (untrained, every detection kept) shows padding and thread count would change its outputs, and the ranks
  start with 1 or 2 CPU threads, as torchrun's defaults would differ;
- `map`, `map50` and `map75` are pycocotools' COCOeval run directly on the original json and the exported
  coco_results.json (shapes_det: on a json written here from the dataset's targets), within 1e-6.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from torch import nn

from src.config import data_config
from src.data import DataConfig
from src.evaluation.loop import evaluate
from src.models import build_model
from src.tasks import get_task
from tests.support import process_state
from tests.support.coco_files import COLOURS, VARIED_CATEGORIES, VARIED_CLASS_NAMES, varied_coco, write_coco_folder
from tests.support.gloo import run_on_ranks
from tests.support.task_data import build_datasets, build_eval_loader

WORLDS = (1, 2, 3)
SHAPES = dict(name="shapes_det", train_size=4, val_size=7, image_size=48, num_classes=4, eval_batch_size=2,
              variable_val_size=True)
EXPORTED = ("predictions.json", "coco_results.json")


class ColourBoxes(nn.Module):
    """A deterministic stand-in detector that finds varied_coco's painted categories: per colour present, its
    enclosing box, a shrunken and a shifted copy (lower scores), and a low-scoring stray box; so some detections
    are right, some wrong, some duplicates and some on crowd regions, from the pixels alone."""

    def __init__(self) -> None:
        super().__init__()
        ids = sorted(c["id"] for c in VARIED_CATEGORIES)
        self.paints = [(ids.index(cid) + 1, torch.tensor(rgb, dtype=torch.float32) / 255) for cid, rgb in
                       COLOURS.items()]

    def forward(self, images: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        out = []
        for image in images:
            boxes, scores, labels = [[0.0, 0.0, 8.0, 8.0]], [0.05], [1]
            for label, rgb in self.paints:
                mask = ((image - rgb[:, None, None]).abs() < 0.05).all(0)
                if not mask.any():
                    continue
                ys, xs = mask.nonzero(as_tuple=True)
                x1, y1, x2, y2 = float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)
                w, h, share = x2 - x1, y2 - y1, float(mask.float().mean())
                boxes += [[x1, y1, x2, y2], [x1 + w / 4, y1 + h / 4, x2 - w / 4, y2 - h / 4],
                          [x1 + 0.3 * w, y1, x2 + 0.3 * w, y2]]
                scores += [0.3 + 0.6 * share, 0.1 + 0.5 * share, 0.2 + 0.1 * share]
                labels += [label] * 3
            out.append({"boxes": torch.tensor(boxes), "scores": torch.tensor(scores), "labels": torch.tensor(labels)})
        return out


def tiny_fcos(num_classes: int) -> nn.Module:
    """torchvision's FCOS on a ResNet-18 + FPN, untrained, the same weights in every process; every detection
    kept (its scores are ~0.09, under the default threshold of 0.2)."""
    torch.manual_seed(0)
    model = build_model({"name": "fcos_resnet18", "head_channels": 64}, {"name": "bn"}, num_classes)
    model.score_thresh = 0.0
    return model.eval()


def _evaluate_all(rank: int, world: int, coco_root: str, out: str) -> dict[str, Any]:
    """Every model on its data, with exports under out/<run>; runs on each rank."""
    torch.set_num_threads(1 + rank % 2)  # what each process had before: evaluation must not depend on it
    coco = data_config(name="coco", root=coco_root, train_split="train", val_split="val", eval_batch_size=2)
    runs = {"colour": (coco, lambda bundle: ColourBoxes()),
            "fcos": (coco, lambda bundle: tiny_fcos(bundle.num_classes)),
            "shapes": (data_config(**SHAPES), lambda bundle: RememberedBoxes(bundle.val))}
    metrics = {}
    for name, (cfg, make_model) in runs.items():
        bundle = build_datasets(cfg, seed=0)
        metrics[name] = evaluate(make_model(bundle), build_eval_loader(bundle.val, cfg, rank, world), get_task("detection"),
                                 bundle.num_classes, "cpu", export=Path(out) / name, class_names=bundle.class_names,
                                 threads=1)
    return {"metrics": metrics, "threads_after": torch.get_num_threads()}


class RememberedBoxes(nn.Module):
    """shapes_det's stand-in: a detector that remembers the validation images' boxes and answers them moved by
    0-3 px, some with the wrong class, plus a stray box; it looks each image up by its pixels, so its answer
    depends on the image alone (any rank, any batch)."""

    def __init__(self, dataset: Any) -> None:
        super().__init__()
        self.known = {}
        for i in range(len(dataset)):
            image, target = dataset[i]
            self.known[image.numpy().tobytes()] = (target["boxes"].clone(), target["labels"].clone())

    def forward(self, images: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        out = []
        for image in images:
            boxes, labels = self.known[image.numpy().tobytes()]
            k = torch.arange(len(boxes))
            moved = boxes + (k % 4).float()[:, None] * torch.tensor([1.0, -1.0, 1.0, 1.0])
            wrong = torch.where(k % 5 == 4, labels % 3 + 1, labels)
            out.append({"boxes": torch.cat([moved, torch.tensor([[0.0, 0.0, 9.0, 9.0]])]),
                        "scores": torch.cat([0.9 - 0.07 * k.float(), torch.tensor([0.5])]),
                        "labels": torch.cat([wrong, torch.tensor([1])])})
        return out


@pytest.fixture(scope="module")
def coco_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The varied COCO-format folder (the same json for both splits)."""
    return write_coco_folder(tmp_path_factory.mktemp("varied_coco"), varied_coco(), varied_coco())


@pytest.fixture(scope="module")
def runs(coco_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[list[dict], Path]]:
    """world size -> (every rank's results, the export folder)."""
    done = {}
    for world in WORLDS:
        out = tmp_path_factory.mktemp(f"world{world}")
        done[world] = run_on_ranks(world, _evaluate_all, str(coco_root), str(out)), out
    return done


def _same(a: dict[str, float], b: dict[str, float]) -> bool:
    return a.keys() == b.keys() and all(a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in a)


def test_metrics_and_exports_are_the_same_bits_at_every_world_size(runs: dict) -> None:
    reference, ref_dir = runs[1][0][0]["metrics"], runs[1][1]
    assert set(reference) == {"colour", "fcos", "shapes"}
    fcos_rows = json.loads((ref_dir / "fcos" / "coco_results.json").read_text())
    assert len(fcos_rows) > 100 and len({r["score"] for r in fcos_rows}) > 100  # real outputs to compare
    for world, (results, out) in runs.items():
        for rank, result in enumerate(results):
            assert result["threads_after"] == 1 + rank % 2, "the process's thread count is restored"
            for name, metrics in result["metrics"].items():
                assert set(metrics) == {"map", "map50", "map75"}
                assert _same(metrics, reference[name]), (world, rank, name, metrics, reference[name])
        for name in reference:
            for file in EXPORTED:
                assert (out / name / file).read_bytes() == (ref_dir / name / file).read_bytes(), (world, name, file)


def _cocoeval(gt: COCO, results_file: Path) -> dict[str, float]:
    """pycocotools run directly, as its README does."""
    with contextlib.redirect_stdout(io.StringIO()):
        evaluation = COCOeval(gt, gt.loadRes(str(results_file)), "bbox")
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    return dict(zip(("map", "map50", "map75"), evaluation.stats[:3].tolist()))


def test_map_is_cocoeval_on_the_original_json_and_the_exported_results(runs: dict, coco_root: Path) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(coco_root / "annotations" / "instances_val.json"))
    for world, (results, out) in runs.items():
        for name in ("colour", "fcos"):
            rows = json.loads((out / name / "coco_results.json").read_text())
            assert {r["image_id"] for r in rows} <= set(gt.getImgIds())  # the file's ids
            assert {r["category_id"] for r in rows} <= {3, 7, 12}
            assert set(rows[0]) == {"image_id", "category_id", "bbox", "score"}
            direct = _cocoeval(gt, out / name / "coco_results.json")
            assert results[0]["metrics"][name] == pytest.approx(direct, abs=1e-6), (world, name)
        colour = results[0]["metrics"]["colour"]
        assert 0.2 < colour["map"] < colour["map50"] < 1  # a metric that can tell a wrong ground truth


def test_shapes_map_is_cocoeval_on_its_targets(runs: dict, tmp_path: Path) -> None:
    """shapes_det's ground truth is its targets: written here as a COCO json, independently of the project."""
    bundle = build_datasets(data_config(**SHAPES), seed=0)
    images, annotations = [], []
    for i in range(len(bundle.val)):
        image, target = bundle.val[i]
        images.append({"id": i, "width": image.shape[2], "height": image.shape[1]})
        for (x1, y1, x2, y2), label in zip(target["boxes"].tolist(), target["labels"].tolist()):
            annotations.append({"id": len(annotations) + 1, "image_id": i, "category_id": label,
                                "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1), "iscrowd": 0})
    path = tmp_path / "shapes.json"
    path.write_text(json.dumps({"images": images, "annotations": annotations,
                                "categories": [{"id": k, "name": n} for k, n in enumerate(bundle.class_names) if k]}))
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(path))
    for world, (results, out) in runs.items():
        direct = _cocoeval(gt, out / "shapes" / "coco_results.json")
        assert 0.2 < direct["map"] < 0.9
        assert results[0]["metrics"]["shapes"] == pytest.approx(direct, abs=1e-6), world
    rows = json.loads((runs[1][1] / "shapes" / "predictions.json").read_text())
    assert sorted({r["index"] for r in rows}, key=int) == [str(i) for i in range(SHAPES["val_size"])]
    assert {"class", "score", "x1", "y1", "x2", "y2"} <= set(rows[0])


def test_one_process_without_a_group_matches_too(runs: dict, coco_root: Path, tmp_path: Path) -> None:
    with process_state.restoring("torch intra-op threads", "torch's global RNG"):
        alone = _evaluate_all(0, 1, str(coco_root), str(tmp_path))
    assert all(_same(alone["metrics"][k], v) for k, v in runs[1][0][0]["metrics"].items())
    assert VARIED_CLASS_NAMES == build_datasets(data_config(name="coco", root=str(coco_root), train_split="train",
                                                           val_split="val"), seed=0).class_names
