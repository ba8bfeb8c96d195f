"""Segmentation evaluation is the same bits at any world size on a folder of images of several sizes.

data=segfolder (src/data/demo_folders.write_segment: JPEG images of 48-80 px a side, palette masks), a real
DeepLabV3 (ResNet-18, untrained, the same weights everywhere) on 1, 2 and 3 gloo ranks that start with 1 or
2 CPU threads, as torchrun's defaults would differ: the metrics, the float loss included, and every exported
mask are identical, byte for byte. This model's logits do change between 1 and 2 threads, so without the
fixed evaluation thread count (trainer.eval_num_threads) the loss would differ in its last bits.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from src.config import data_config
from src.data.segmentation.demo_folders import write_segment
from src.evaluation.loop import evaluate
from src.models import build_model
from src.tasks import get_task
from tests.support.gloo import run_on_ranks
from tests.support.task_data import build_datasets, build_eval_loader

VAL_IMAGES = 7


def _evaluate(rank: int, world: int, root: str, out: str) -> dict[str, Any]:
    torch.set_num_threads(1 + rank % 2)  # what each process had before: evaluation must not depend on it
    cfg = data_config(name="segfolder", root=root, eval_batch_size=4)
    bundle = build_datasets(cfg, seed=0)
    torch.manual_seed(0)
    model = build_model({"name": "deeplabv3_resnet18", "head_channels": 32, "output_stride": 16},
                        {"name": "bn"}, bundle.num_classes).eval()
    metrics = evaluate(model, build_eval_loader(bundle.val, cfg, rank, world), get_task("segmentation"), bundle.num_classes,
                       "cpu", export=out, class_names=bundle.class_names, threads=1)
    return {"metrics": metrics, "threads_after": torch.get_num_threads()}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_segment(tmp_path_factory.mktemp("segfolder"), train_images=2, val_images=VAL_IMAGES)


def test_metrics_and_masks_are_the_same_bits_at_every_world_size(folder: Path, tmp_path: Path) -> None:
    sizes = {build_datasets(data_config(name="segfolder", root=str(folder)), seed=0).val[i][0].shape[1:]
             for i in range(VAL_IMAGES)}
    assert len(sizes) > 3, "images of several sizes"
    reference = None
    for world in (1, 2, 3):
        out = tmp_path / f"world{world}"
        results = run_on_ranks(world, _evaluate, str(folder), str(out))
        masks = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
        assert len(masks) == VAL_IMAGES
        if reference is None:
            reference = results[0]["metrics"], masks
            assert 0 < reference[0]["loss"] < math.inf and 0 <= reference[0]["miou"] <= 1
        for rank, result in enumerate(results):
            assert result["threads_after"] == 1 + rank % 2, "the process's thread count is restored"
            assert result["metrics"].keys() == reference[0].keys()
            for key, value in result["metrics"].items():
                assert value == reference[0][key] or (math.isnan(value) and math.isnan(reference[0][key])), \
                    (world, rank, key, value, reference[0][key])
        assert masks == reference[1], world
