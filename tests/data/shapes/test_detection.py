"""data=shapes_det: deterministic scenes, one tight box per visible shape, and transforms that move the boxes."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torchvision import tv_tensors

from src.config import data_config
from src.data.batch import collate_lists
from src.data.config import DataConfig
from src.data.datasets.shapes import drawing
from src.data.datasets.shapes.datasets import MIN_VISIBLE_AREA, ShapesDetection, ShapesSegmentation
from src.data.registry import dataset_entry
from src.data.seeded import IndexedDataset, SeededTransformDataset
from src.tasks.detection.transforms import detection_eval_transform, detection_train_transform

KINDS = 4
ARGS = dict(image_size=64, num_shape_kinds=KINDS, min_shapes=3, max_shapes=6, radius_range=(0.1, 0.3))


def test_deterministic_and_the_shapes_seg_scenes() -> None:
    cached = ShapesDetection(3, "val", 20, cache=True, **ARGS)
    fresh = ShapesDetection(3, "val", 20, cache=False, **ARGS)
    seg = ShapesSegmentation(3, "val", 20, **ARGS)
    for i in (0, 7):
        image, target = cached[i]
        cached[i]  # the cached copy is what a second access returns
        again_image, again = fresh[i]
        assert torch.equal(image, again_image) and torch.equal(target["boxes"], again["boxes"])
        assert torch.equal(target["labels"], again["labels"])
        assert torch.equal(image, seg[i][0])  # same (seed, split, index): the same scene as shapes_seg
    assert not torch.equal(cached[0][0], cached[1][0])
    assert not torch.equal(cached[0][0], ShapesDetection(4, "val", 1, **ARGS)[0][0])


def test_each_box_is_the_tight_box_of_a_visible_shape() -> None:
    """Per shape drawn (owner map): a box exactly when >= MIN_VISIBLE_AREA pixels show, holding all of them and
    touched by them on all four sides (x2, y2 exclusive); its label is the shape's class in the segmentation mask."""
    ds = ShapesDetection(1, "train", 30, cache=False, **ARGS)
    dropped = 0
    for i in range(len(ds)):
        image, target = ds[i]
        _, owner, kinds = drawing.make_instance_image(1, "train", i, 64, KINDS, 3, 6, radius_range=(0.1, 0.3))
        _, mask = drawing.make_segmentation_image(1, "train", i, 64, KINDS, 3, 6, radius_range=(0.1, 0.3))
        boxes, labels = target["boxes"].tolist(), target["labels"].tolist()
        k = 0
        for j in range(1, len(kinds) + 1):
            ys, xs = np.nonzero(owner == j)
            if len(ys) < MIN_VISIBLE_AREA:
                dropped += 1
                continue
            x1, y1, x2, y2 = boxes[k]
            assert x1 == xs.min() and y1 == ys.min() and x2 == xs.max() + 1 and y2 == ys.max() + 1, (i, j)
            assert labels[k] == kinds[j - 1] + 1 and (mask[ys, xs] == labels[k]).all()
            k += 1
        assert k == len(boxes) == len(labels)
        b = target["boxes"]
        assert isinstance(b, tv_tensors.BoundingBoxes) and b.format == tv_tensors.BoundingBoxFormat.XYXY
        assert tuple(b.canvas_size) == (64, 64) and b.dtype == torch.float32 and target["labels"].dtype == torch.int64
    assert dropped > 0  # the rule is exercised: some shapes are hidden or nearly so


def test_several_objects_of_every_class() -> None:
    cfg = data_config(name="shapes_det", train_size=60, val_size=4, image_size=64, num_classes=KINDS + 1,
                     min_shapes=3, max_shapes=5)
    cfg.validate()
    splits = dataset_entry("shapes_det").builder(cfg)
    assert splits.class_names == ["background", "circle", "square", "triangle", "star"]
    counts = [len(splits.train[i][1]["labels"]) for i in range(60)]
    labels = torch.cat([splits.train[i][1]["labels"] for i in range(60)])
    assert np.mean(np.array(counts) >= 3) > 0.9 and max(counts) <= 5
    assert set(labels.tolist()) == set(range(1, KINDS + 1))
    with pytest.raises(ValueError, match=r"data\.num_classes for shapes_det must be in 3\.\.9"):
        data_config(name="shapes_det", num_classes=10).validate()


def test_flip_moves_the_boxes_and_batches_are_lists() -> None:
    base = ShapesDetection(0, "train", 16, **ARGS)
    train = SeededTransformDataset(base, detection_train_transform(data_config(name="shapes_det")), seed=0)
    flipped = kept = 0
    for i in range(len(base)):
        raw_image, raw = base[i]
        image, target = train[i]
        assert image.dtype == torch.float32 and target["labels"].dtype == torch.int64
        assert torch.equal(target["labels"], raw["labels"])  # no box lost: all are at least a pixel wide
        boxes = raw["boxes"].as_subclass(torch.Tensor)
        if torch.allclose(image, raw_image.flip(-1).float() / 255, atol=1e-6):
            flipped += 1
            boxes = torch.stack([64 - boxes[:, 2], boxes[:, 1], 64 - boxes[:, 0], boxes[:, 3]], dim=1)
        else:
            kept += 1
            assert torch.allclose(image, raw_image.float() / 255, atol=1e-6)
        assert torch.equal(target["boxes"], boxes)
    assert flipped and kept
    no_flip = detection_train_transform(data_config(name="shapes_det", hflip=False))
    assert torch.equal(no_flip(*base[0])[1]["boxes"], base[0][1]["boxes"].as_subclass(torch.Tensor))

    val = IndexedDataset(SeededTransformDataset(base, detection_eval_transform(data_config()), seed=0))
    empty = (tv_tensors.Image(torch.zeros(3, 8, 8, dtype=torch.uint8)),
             {"boxes": tv_tensors.BoundingBoxes(torch.zeros(0, 4), format="XYXY", canvas_size=(8, 8)),
              "labels": torch.zeros(0, dtype=torch.int64)})
    image, target = detection_eval_transform(data_config())(*empty)
    assert tuple(target["boxes"].shape) == (0, 4) and image.dtype == torch.float32
    images, targets, indices = collate_lists([val[3], val[5]])
    assert [tuple(x.shape) for x in images] == [(3, 64, 64)] * 2 and indices.tolist() == [3, 5]
    assert indices.dtype == torch.int64 and torch.equal(targets[1]["labels"], base[5][1]["labels"])
    batch = collate_lists([(*train[0], 0), (image, target, 1)])
    assert len(batch.images) == len(batch.targets) == batch.size == 2 and batch.targets[1]["labels"].numel() == 0
