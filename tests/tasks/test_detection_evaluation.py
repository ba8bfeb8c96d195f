"""Detection evaluation is exact under any world size: 1, 2 and 3 gloo ranks give the mAP that one process
and torchmetrics run directly on every image's predictions give."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from src.data import DataConfig
from tests.support.task_data import build_datasets, build_eval_loader
from src.engine.evaluation.evaluator import evaluate
from src.config import data_config
from tests.support.gloo import run_on_ranks

# 7 images: shards of 7 (1 rank), 4+3 (2 ranks) and 3+2+2 (3 ranks); eval batches of 2 leave a short last one.
DATA = dict(name="shapes_det", train_size=4, val_size=7, image_size=64, num_classes=4, eval_batch_size=2)


class BoxesFromPixels(nn.Module):
    """A deterministic stand-in detector: per image, boxes around its brightest and darkest regions, with scores
    and labels from the pixels, so predictions depend on the image alone (any rank, any batch)."""

    def forward(self, images: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        out = []
        for image in images:
            gray = image.mean(0)
            h, w = gray.shape
            rows = []
            for k, q in enumerate((0.1, 0.5, 0.9)):
                mask = gray >= gray.quantile(q) if k % 2 == 0 else gray <= gray.quantile(q)
                ys, xs = mask.nonzero(as_tuple=True)
                rows.append(torch.stack([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]).float())
            boxes = torch.stack(rows).clamp(max=float(max(h, w)))
            scores = image[:, : len(rows), 0].mean(0).clamp(0.05, 1.0)
            labels = 1 + (image[:, 0, : len(rows)].sum(0) * 100).long() % 3
            out.append({"boxes": boxes, "scores": scores, "labels": labels})
        return out


def _evaluate(rank: int, world: int, export: str | None = None) -> dict[str, float]:
    bundle = build_datasets(data_config(**DATA), seed=0)
    loader = build_eval_loader(bundle.val, data_config(**DATA), rank, world)
    return evaluate(BoxesFromPixels(), loader, "detection", bundle.num_classes, "cpu", export=export,
                    class_names=bundle.class_names)


@pytest.fixture(scope="module")
def direct() -> dict[str, float]:
    """torchmetrics' MeanAveragePrecision updated with every image's predictions at once, in one process."""
    from torchmetrics.detection import MeanAveragePrecision

    bundle = build_datasets(data_config(**DATA), seed=0)
    samples = [bundle.val[i] for i in range(len(bundle.val))]
    predictions = BoxesFromPixels()([image for image, _ in samples])
    metric = MeanAveragePrecision(box_format="xyxy", iou_type="bbox")
    metric.update(predictions, [{"boxes": t["boxes"], "labels": t["labels"]} for _, t in samples])
    result = metric.compute()
    return {"map": float(result["map"]), "map50": float(result["map_50"]), "map75": float(result["map_75"])}


@pytest.mark.parametrize("world", [1, 2, 3])
def test_detection_map_is_the_same_for_any_world_size(world: int, direct: dict[str, float], tmp_path: Path) -> None:
    assert 0 < direct["map50"] < 1 and not math.isnan(direct["map"])  # a result that can tell a wrong merge
    results = run_on_ranks(world, _evaluate, str(tmp_path))
    for rank, metrics in enumerate(results):
        assert metrics == direct, (rank, metrics, direct)
    rows = json.loads((tmp_path / "predictions.json").read_text())
    assert sorted({r["index"] for r in rows}, key=int) == [str(i) for i in range(DATA["val_size"])]
    assert len(rows) == 3 * DATA["val_size"] and {"class", "score", "x1", "y1", "x2", "y2"} <= set(rows[0])


def test_one_rank_without_a_group_matches_too(direct: dict[str, Any]) -> None:
    assert _evaluate(0, 1) == direct
