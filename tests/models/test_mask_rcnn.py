"""Mask R-CNN models: torchvision's API in training and eval, the configured norm in the backbone and the FPN only,
the layout of torchvision's model, and SyncBN on 2 gloo ranks == BatchNorm on one process."""
from __future__ import annotations

import re

import pytest
import torch
from torch import nn
from torchvision.models.detection import maskrcnn_resnet50_fpn
from torchvision.models.detection._utils import Matcher

from src.models import build_model
from src.syncbn import SyncBatchNorm
from tests.models.test_config import assert_refused
from tests.support.gloo import run_on_ranks

SMALL = {"name": "maskrcnn_resnet18", "head_channels": 32}  # FPN and mask head width
NUM_CLASSES = 3  # background + 2 object classes


def _targets(n: int, dtype: torch.dtype = torch.float32) -> list[dict[str, torch.Tensor]]:
    """n copies of two objects on a 64 px image: a 30 px square and a 12 px one, their masks discs in the boxes."""
    boxes = torch.tensor([[4.0, 6.0, 34.0, 36.0], [40.0, 44.0, 52.0, 56.0]], dtype=dtype)
    ys, xs = torch.meshgrid(torch.arange(64.0), torch.arange(64.0), indexing="ij")
    masks = torch.stack([((xs - 19) ** 2 + (ys - 21) ** 2 <= 15 ** 2), ((xs - 46) ** 2 + (ys - 50) ** 2 <= 6 ** 2)])
    return [{"boxes": boxes.clone(), "labels": torch.tensor([1, 2]), "masks": masks.to(torch.uint8)} for _ in range(n)]


def _norms(module: nn.Module) -> list[nn.Module]:
    return [m for m in module.modules() if isinstance(m, (nn.modules.batchnorm._BatchNorm, nn.GroupNorm))]


def test_syncbn_model_trains_and_predicts_masks() -> None:
    model = build_model(SMALL, {"name": "syncbn"}, NUM_CLASSES)
    # Our SyncBN in every norm position of the ResNet (20) and the FPN (inner + output conv on P2-P5), none in the
    # RPN, box and mask heads.
    assert len(_norms(model.backbone.body)) == 20 and len(_norms(model.backbone.fpn)) == 8
    assert all(isinstance(m, SyncBatchNorm) for m in _norms(model))
    assert len(_norms(model)) == 28 and all(p.requires_grad for p in model.parameters())

    losses = model.train()([torch.rand(3, 64, 64), torch.rand(3, 64, 64)], _targets(2))
    assert set(losses) == {"loss_classifier", "loss_box_reg", "loss_mask", "loss_objectness", "loss_rpn_box_reg"}
    assert all(v.ndim == 0 and torch.isfinite(v) for v in losses.values()), losses
    sum(losses.values()).backward()
    assert all(p.grad is not None for p in model.roi_heads.mask_predictor.parameters())

    model.eval().roi_heads.score_thresh = 0.0  # an untrained model's scores are low: keep some to look at
    with torch.no_grad():
        out = model([torch.rand(3, 64, 64), torch.rand(3, 48, 56)])
    for pred, (h, w) in zip(out, [(64, 64), (48, 56)]):
        n = len(pred["boxes"])
        assert n > 0 and pred["masks"].shape == (n, 1, h, w)  # pasted into the input image's own pixels
        assert 0 <= float(pred["masks"].min()) and float(pred["masks"].max()) <= 1
        assert ((pred["labels"] >= 1) & (pred["labels"] < NUM_CLASSES)).all()


def test_layout_is_torchvisions() -> None:
    """Our Mask R-CNN-50 is torchvision's but for the FPN's 8 convs carrying a norm layer (weight + bias) instead
    of a bias."""
    with torch.device("meta"):
        ours = build_model({"name": "maskrcnn_resnet50"}, {"name": "bn"}, 91)
        theirs = maskrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=91)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters()) + 8 * 256


def test_targets_need_object_labels_and_masks() -> None:
    model = build_model(SMALL, {"name": "bn"}, NUM_CLASSES).train()
    bad = _targets(1)
    bad[0]["labels"] = torch.tensor([0, 1])
    with pytest.raises(ValueError, match=re.escape("labels must be 1..2 (0 is the background")):
        model([torch.rand(3, 64, 64)], bad)
    no_masks = [{k: v for k, v in t.items() if k != "masks"} for t in _targets(1)]
    with pytest.raises(ValueError, match="Mask R-CNN trains on targets with 'masks'"):
        model([torch.rand(3, 64, 64)], no_masks)
    with pytest.raises(ValueError, match="needs num_classes >= 2"):
        build_model(SMALL, {"name": "bn"}, 1)


def _same_sampling(model: nn.Module) -> nn.Module:
    """Per-image counts that do not depend on the image: every anchor and RoI the matchers label is sampled (the
    losses' normalisers then depend on the boxes alone, which both images share), 8 proposals per image, and only
    the ground-truth boxes (IoU 1 with themselves) are positive RoIs, so the mask loss averages 2 RoIs per image.
    Then the ranks' mean loss is the one-process loss of both images, exactly."""
    model.rpn.fg_bg_sampler.batch_size_per_image = 10 ** 6
    model.rpn._post_nms_top_n["training"] = 8
    model.roi_heads.fg_bg_sampler.batch_size_per_image = 10 ** 6
    model.roi_heads.proposal_matcher = Matcher(0.999, 0.999, allow_low_quality_matches=False)
    return model


def _rank_step(rank: int, world: int, payload: dict) -> dict:
    model, image = _same_sampling(payload["model"]), payload["images"][rank]
    losses = model([image], _targets(1, torch.float64))
    sum(losses.values()).backward()
    return {"losses": {k: v.detach() for k, v in losses.items()},
            "grads": {n: p.grad for n, p in model.named_parameters()}, "buffers": dict(model.named_buffers())}


def test_syncbn_mask_rcnn_on_two_processes_matches_bn_on_one() -> None:
    """Two ranks with one image each and norm=syncbn == one process with both images and norm=bn: losses,
    gradients (averaged over the ranks, as DDP does) and running statistics, in float64."""
    sync = build_model(SMALL, {"name": "syncbn"}, NUM_CLASSES).double()  # no process group yet: WORLD at forward
    bn = build_model(SMALL, {"name": "bn"}, NUM_CLASSES).double()
    bn.load_state_dict(sync.state_dict())
    images = [torch.rand(3, 64, 64, dtype=torch.float64) for _ in range(2)]
    sync.eval()([images[0]])  # loads (building if needed) the kernel extension here, so the workers import it
    ranks = run_on_ranks(2, _rank_step, {"model": sync.train(), "images": images})
    losses = _same_sampling(bn.train())(images, _targets(2, torch.float64))
    sum(losses.values()).backward()
    assert set(losses) == set(ranks[0]["losses"]) and float(losses["loss_mask"].detach()) > 0
    for key, value in losses.items():
        torch.testing.assert_close((ranks[0]["losses"][key] + ranks[1]["losses"][key]) / 2, value.detach(),
                                   rtol=1e-9, atol=1e-12, msg=key)
    for name, p in bn.named_parameters():
        torch.testing.assert_close((ranks[0]["grads"][name] + ranks[1]["grads"][name]) / 2, p.grad,
                                   rtol=1e-6, atol=1e-10, msg=name)
    buffers = dict(bn.named_buffers())
    assert sum(name.endswith("running_mean") for name in buffers) == 20 + 8  # the ResNet's and the FPN's
    for name, b in buffers.items():
        for r in ranks:
            torch.testing.assert_close(r["buffers"][name], b, rtol=1e-10, atol=1e-12, msg=name)


def test_bad_options() -> None:
    assert_refused({"name": "maskrcnn_resnet18", "detection_image_size": 16},
                   "model.detection_image_size must be an int >= 32")


def test_its_models_are_registered() -> None:
    from src.tasks import task_models

    assert set(task_models("instance_segmentation")) == {f"maskrcnn_resnet{depth}" for depth in (18, 34, 50)}


def test_roi_poolers_read_the_fpn_levels_whatever_the_first_batch() -> None:
    """torchvision's poolers infer their scales on the first call and keep them; a 40 px image (padded to 64) would
    make P2's 1/4 a 1/2, and every later result depend on which batch came first."""
    model = build_model(SMALL, {"name": "bn"}, NUM_CLASSES).eval()
    fresh = build_model(SMALL, {"name": "bn"}, NUM_CLASSES).eval()
    fresh.load_state_dict(model.state_dict())
    image = torch.rand(3, 48, 44)
    with torch.no_grad():
        alone = fresh([image])[0]
        model([torch.rand(3, 40, 40)])
        after = model([image])[0]
    for pool in (model.roi_heads.box_roi_pool, model.roi_heads.mask_roi_pool):
        assert pool.scales == [0.25, 0.125, 0.0625, 0.03125]
    assert all(torch.equal(alone[k], after[k]) for k in alone)
