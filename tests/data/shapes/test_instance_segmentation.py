"""data=shapes_inst: the shapes_det scenes by instance, each mask the visible pixels of one shape, and transforms
that move the masks with their boxes."""
from __future__ import annotations

import numpy as np
import torch
from torchvision import tv_tensors

from src.config import data_config
from src.data.datasets.shapes import drawing
from src.data.datasets.shapes.datasets import ShapesDetection
from src.data.datasets.shapes.instance_segmentation import ShapesInstances
from src.tasks.instance_segmentation.transforms import INSTANCE_SEGMENTATION_DATA
from tests.support.task_data import build_datasets

KINDS = 4
ARGS = dict(image_size=48, num_shape_kinds=KINDS, min_shapes=3, max_shapes=6, radius_range=(0.1, 0.3))


def test_the_shapes_det_scenes_with_the_visible_pixels_of_each_shape() -> None:
    inst, det = ShapesInstances(1, "train", 12, cache=False, **ARGS), ShapesDetection(1, "train", 12, **ARGS)
    dropped = 0
    for i in range(len(inst)):
        image, target = inst[i]
        det_image, det_target = det[i]
        assert torch.equal(image, det_image) and torch.equal(target["labels"], det_target["labels"])
        assert torch.equal(target["boxes"], det_target["boxes"])
        _, owner, kinds = drawing.make_instance_image(1, "train", i, 48, KINDS, 3, 6, radius_range=(0.1, 0.3))
        masks = target["masks"]
        assert isinstance(masks, tv_tensors.Mask) and masks.dtype == torch.uint8 and masks.shape[1:] == (48, 48)
        visible = [j for j in range(1, len(kinds) + 1) if (owner == j).sum() >= 16]
        dropped += len(kinds) - len(visible)
        assert len(masks) == len(visible) == len(target["boxes"])
        for mask, j, box in zip(masks, visible, target["boxes"].tolist()):
            assert np.array_equal(mask.numpy(), (owner == j).astype(np.uint8)), (i, j)
            ys, xs = mask.nonzero(as_tuple=True)
            assert box == [xs.min().item(), ys.min().item(), xs.max().item() + 1, ys.max().item() + 1]
        assert int(masks.sum(0).max()) <= 1  # later shapes hide earlier ones: no pixel in two masks
    assert dropped > 0  # the rule that drops barely visible shapes was exercised


def test_cached_and_fresh_agree() -> None:
    cached, fresh = ShapesInstances(3, "val", 4, cache=True, **ARGS), ShapesInstances(3, "val", 4, cache=False, **ARGS)
    for i in range(4):
        cached[i]
        assert torch.equal(cached[i][1]["masks"], fresh[i][1]["masks"])


def test_the_training_transform_flips_masks_with_their_boxes() -> None:
    cfg = data_config(name="shapes_inst", image_size=48, train_size=8, val_size=2, num_classes=5, hflip=True)
    raw = ShapesInstances(0, "train", 8, **{**ARGS, "min_shapes": 2, "max_shapes": 5, "radius_range": (0.12, 0.25)})
    train = INSTANCE_SEGMENTATION_DATA.train(cfg, False)
    flips = 0
    for i in range(8):
        image, target = raw[i]
        out_image, out = train(image, target)
        assert out_image.dtype == torch.float32 and out["masks"].dtype == torch.uint8
        assert type(out["masks"]) is torch.Tensor and len(out["masks"]) == len(out["boxes"]) == len(out["labels"])
        flipped = torch.equal(out["masks"], target["masks"].flip(-1).as_subclass(torch.Tensor))
        flips += flipped
        for mask, box in zip(out["masks"], out["boxes"].tolist()):
            ys, xs = mask.nonzero(as_tuple=True)
            assert box == [xs.min().item(), ys.min().item(), xs.max().item() + 1, ys.max().item() + 1]
    assert 0 < flips < 8


def test_registered_for_instance_segmentation_with_variable_sizes() -> None:
    bundle = build_datasets(dict(name="shapes_inst", train_size=2, val_size=6, image_size=40, num_classes=3,
                                 variable_val_size=True), seed=0)
    assert bundle.task == "instance_segmentation" and bundle.class_names == ["background", "circle", "square"]
    sizes = {tuple(bundle.val[i][0].shape[1:]) for i in range(6)}
    assert len(sizes) > 1 and all(bundle.val[i][1]["masks"].shape[1:] == bundle.val[i][0].shape[1:] for i in range(6))
