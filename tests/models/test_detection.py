"""Detection models: torchvision's API in training and eval, the configured norm in the backbone and the FPN
only, backbone weights, the input size rule, and SyncBN on 2 gloo ranks == BatchNorm on one process."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn
from torchvision.models import resnet18
from torchvision.models.detection import fasterrcnn_resnet50_fpn, fcos_resnet50_fpn, retinanet_resnet50_fpn_v2

from src.models import FrozenBatchNorm2d, build_model
from src.models.detection import DetectionTransform
from src.syncbn import SyncBatchNorm
from tests.models.test_config import assert_refused
from tests.support.gloo import run_on_ranks

FAMILIES = ("fcos", "retinanet", "fasterrcnn")
SMALL = {"head_channels": 64}  # FPN / head width: the least the heads' GroupNorm(32) takes
NUM_CLASSES = 3  # background + 2 object classes


def _targets(n: int, dtype: torch.dtype = torch.float32) -> list[dict[str, torch.Tensor]]:
    """n copies of two boxes (x1 y1 x2 y2, pixels) on a 64 px image: a 30 px object and a 12 px one."""
    boxes = torch.tensor([[4.0, 6.0, 34.0, 36.0], [40.0, 44.0, 52.0, 56.0]], dtype=dtype)
    return [{"boxes": boxes.clone(), "labels": torch.tensor([1, 2])} for _ in range(n)]


def _norms(module: nn.Module) -> list[nn.Module]:
    return [m for m in module.modules() if isinstance(m, (nn.modules.batchnorm._BatchNorm, nn.GroupNorm,
                                                          FrozenBatchNorm2d))]


@pytest.mark.parametrize("family", FAMILIES)
def test_syncbn_model_trains_and_predicts(family: str) -> None:
    model = build_model({"name": f"{family}_resnet18", **SMALL}, {"name": "syncbn"}, NUM_CLASSES)
    body, fpn = model.backbone.body, model.backbone.fpn
    # Our SyncBN in every norm position of the ResNet (20) and the FPN (inner + output conv per level).
    levels = 4 if family == "fasterrcnn" else 3
    assert len(_norms(body)) == 20 and len(_norms(fpn)) == 2 * levels
    assert all(isinstance(m, SyncBatchNorm) for m in _norms(model.backbone))
    in_backbone = {id(m) for m in model.backbone.modules()}
    heads = [m for m in _norms(model) if id(m) not in in_backbone]
    if family == "fasterrcnn":
        assert heads == []  # torchvision's RPN and box heads have no norm layers
    else:  # the heads' GroupNorm(32) is left alone: 4 convs per branch, classification and regression
        assert len(heads) == 8 and all(type(m) is nn.GroupNorm and m.num_groups == 32 for m in heads)
    assert all(p.requires_grad for p in model.parameters())  # nothing frozen: training from scratch

    images = [torch.rand(3, 64, 64), torch.rand(3, 64, 64)]
    losses = model.train()(images, _targets(2))
    assert losses and all(v.ndim == 0 and torch.isfinite(v) for v in losses.values()), losses
    sum(losses.values()).backward()
    assert all(p.grad is not None for p in body.parameters()) and all(p.grad is not None for p in fpn.parameters())

    model.eval()
    owner = model.roi_heads if family == "fasterrcnn" else model
    owner.score_thresh = 0.0  # an untrained model's scores are low: keep some boxes to look at
    with torch.no_grad():
        out = model([torch.rand(3, 64, 64), torch.rand(3, 48, 64)])
    assert len(out) == 2
    for pred, (h, w) in zip(out, [(64, 64), (48, 64)]):
        n = len(pred["boxes"])
        assert n > 0 and pred["boxes"].shape == (n, 4) and pred["scores"].shape == pred["labels"].shape == (n,)
        assert pred["labels"].dtype == torch.int64 and ((pred["labels"] >= 1) & (pred["labels"] < NUM_CLASSES)).all()
        assert (pred["boxes"][:, 2:] <= torch.tensor([w, h])).all()  # in the input image's own coordinates


@pytest.mark.parametrize(("norm", "backbone_type"), [("gn", nn.GroupNorm), ("frozen_bn", FrozenBatchNorm2d)])
def test_other_norms_reach_backbone_and_fpn_only(norm: str, backbone_type: type) -> None:
    model = build_model({"name": "fcos_resnet18", **SMALL}, {"name": norm}, NUM_CLASSES)
    assert all(type(m) is backbone_type for m in _norms(model.backbone))
    assert len(_norms(model.backbone)) == 20 + 6
    if norm == "gn":
        assert {m.num_groups for m in _norms(model.backbone)} == {16}  # norm.num_groups
    assert [m.num_groups for m in _norms(model.head)] == [32] * 8  # the heads' own GroupNorm


# Our models are torchvision's (same ResNet-50, FPN and heads), apart from: the FPN's convs (6 on P3-P5, 8 on
# P2-P5) carry a norm layer (weight + bias) instead of a bias; RetinaNet's P6 is computed from P5 (as in FCOS)
# rather than from the 2048-channel C5 as in torchvision's v2; FCOS and RetinaNet have no output for label 0
# (ours with 92 classes has the 91 outputs of torchvision's with 91).
@pytest.mark.parametrize(("name", "torchvision_builder", "num_classes", "difference"), [
    ("fcos_resnet50", fcos_resnet50_fpn, 92, 6 * 256),
    ("retinanet_resnet50", retinanet_resnet50_fpn_v2, 92, 6 * 256 - (2048 - 256) * 9 * 256),
    ("fasterrcnn_resnet50", fasterrcnn_resnet50_fpn, 91, 8 * 256),
])
def test_layout_is_torchvisions(name: str, torchvision_builder, num_classes: int, difference: int) -> None:
    with torch.device("meta"):
        ours = build_model({"name": name}, {"name": "bn"}, num_classes)
        theirs = torchvision_builder(weights=None, weights_backbone=None, num_classes=91)
    count = sum(p.numel() for p in ours.parameters())
    assert count == sum(p.numel() for p in theirs.parameters()) + difference


@pytest.mark.parametrize("family", ["fcos", "fasterrcnn"])
def test_labels_are_objects_only(family: str) -> None:
    """Label 0 is the background for every family: never a target's label, never a prediction's."""
    model = build_model({"name": f"{family}_resnet18", **SMALL}, {"name": "bn"}, NUM_CLASSES)
    if family == "fcos":  # no output for the background (Faster R-CNN's softmax has one)
        assert model.head.classification_head.num_classes == NUM_CLASSES - 1
    for labels in ([0, 1], [1, NUM_CLASSES]):
        targets = [{"boxes": torch.tensor([[4.0, 6.0, 34.0, 36.0], [40.0, 44.0, 52.0, 56.0]]),
                    "labels": torch.tensor(labels)}]
        message = f"labels must be 1..{NUM_CLASSES - 1} (0 is the background, which has no boxes); got labels {labels}"
        with pytest.raises(ValueError, match=re.escape(message)):
            model.train()([torch.rand(3, 64, 64)], targets)
    with pytest.raises(ValueError, match="needs num_classes >= 2"):
        build_model({"name": "retinanet_resnet18", **SMALL}, {"name": "bn"}, 1)


def test_backbone_weights_load_into_the_resnet(tmp_path: Path) -> None:
    torch.manual_seed(3)
    imagenet = resnet18(weights=None)  # stands in for torchvision's resnet18-f37072fd.pth (fc: 1000 classes)
    path = tmp_path / "resnet18.pth"
    torch.save(imagenet.state_dict(), path)
    model = build_model({"name": "retinanet_resnet18", **SMALL, "backbone_weights": str(path)}, {"name": "syncbn"},
                        NUM_CLASSES)
    expected = {k: v for k, v in imagenet.state_dict().items() if not k.startswith("fc.")}
    loaded = model.backbone.body.state_dict()
    assert loaded.keys() == expected.keys() and all(torch.equal(loaded[k], expected[k]) for k in expected)


def test_transform_resizes_only_with_a_size() -> None:
    images = [torch.rand(3, 48, 80)]
    boxes = [{"boxes": torch.tensor([[8.0, 4.0, 40.0, 24.0]]), "labels": torch.tensor([1])}]
    kept, targets = DetectionTransform(None).train()(images, boxes)
    assert kept.image_sizes == [(48, 80)] and kept.tensors.shape == (1, 3, 64, 96)  # padded to a multiple of 32
    assert torch.equal(targets[0]["boxes"], boxes[0]["boxes"])
    resized, targets = DetectionTransform(160).train()(images, boxes)
    assert resized.image_sizes == [(96, 160)]  # the longer side to 160, aspect ratio kept
    torch.testing.assert_close(targets[0]["boxes"], 2 * boxes[0]["boxes"])


def _rank_step(rank: int, world: int, payload: dict) -> dict:
    model, image = payload["model"], payload["images"][rank]
    losses = model([image], _targets(1, torch.float64))
    sum(losses.values()).backward()
    return {"losses": {k: v.detach() for k, v in losses.items()},
            "grads": {n: p.grad for n, p in model.named_parameters()}, "buffers": dict(model.named_buffers())}


def test_syncbn_fcos_on_two_processes_matches_bn_on_one() -> None:
    """Two ranks with one image each and norm=syncbn == one process with both images and norm=bn: losses,
    gradients (averaged over the ranks, as DDP does) and running statistics, in float64.

    FCOS normalises its losses by the batch's number of foreground points; both images have the same boxes,
    so each rank's count is half the batch's and the ranks' mean loss is the one-process loss exactly."""
    torch.manual_seed(0)
    cfg = {"name": "fcos_resnet18", **SMALL}
    sync = build_model(cfg, {"name": "syncbn"}, NUM_CLASSES).double()  # no process group yet: WORLD at forward
    bn = build_model(cfg, {"name": "bn"}, NUM_CLASSES).double()
    bn.load_state_dict(sync.state_dict())
    images = [torch.rand(3, 64, 64, dtype=torch.float64) for _ in range(2)]
    sync.eval()([images[0]])  # loads (building if needed) the kernel extension here, so the workers import it
    ranks = run_on_ranks(2, _rank_step, {"model": sync.train(), "images": images})
    losses = bn.train()(images, _targets(2, torch.float64))
    sum(losses.values()).backward()
    for key, value in losses.items():
        torch.testing.assert_close((ranks[0]["losses"][key] + ranks[1]["losses"][key]) / 2, value.detach(),
                                   rtol=1e-10, atol=1e-12, msg=key)
    for name, p in bn.named_parameters():
        torch.testing.assert_close((ranks[0]["grads"][name] + ranks[1]["grads"][name]) / 2, p.grad,
                                   rtol=1e-6, atol=1e-10, msg=name)
    buffers = dict(bn.named_buffers())
    assert sum(name.endswith("running_mean") for name in buffers) == 20 + 6  # the ResNet's and the FPN's
    for name, b in buffers.items():
        for r in ranks:
            torch.testing.assert_close(r["buffers"][name], b, rtol=1e-10, atol=1e-12, msg=name)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"name": "fcos_resnet18", "detection_image_size": 16}, "model.detection_image_size must be an int >= 32"),
    ({"name": "retinanet_resnet18", "head_channels": 48}, "model.head_channels=48: .* multiple of 32"),
    ({"name": "fcos_resnet18", "head_channels": 32}, "model.head_channels=32: .* at least 64"),
    ({"name": "resnet20", "detection_image_size": 128}, "model.detection_image_size=128 is not read by model=resnet20: "
                                                        "it is an option of fcos, retinanet, fasterrcnn"),
])
def test_bad_options(overrides: dict, message: str) -> None:
    assert_refused(overrides, message)


def test_its_models_are_registered() -> None:
    from src.tasks import task_models

    assert set(task_models("detection")) == {f"{family}_resnet{depth}" for family in FAMILIES
                                              for depth in (18, 34, 50)}


def test_faster_rcnn_roi_pooler_reads_the_fpn_levels_whatever_the_first_batch() -> None:
    """torchvision's pooler infers its scales on the first call and keeps them; a 40 px image (padded to 64) would
    make P2's 1/4 a 1/2, and every later result depend on which batch came first."""
    cfg = {"name": "fasterrcnn_resnet18", "head_channels": 32}
    torch.manual_seed(0)
    model = build_model(cfg, {"name": "bn"}, 3).eval()
    fresh = build_model(cfg, {"name": "bn"}, 3).eval()
    fresh.load_state_dict(model.state_dict())
    model.roi_heads.score_thresh = fresh.roi_heads.score_thresh = 0.0  # every box kept: outputs to compare
    image = torch.rand(3, 48, 44)
    with torch.no_grad():
        alone = fresh([image])[0]
        model([torch.rand(3, 40, 40)])
        after = model([image])[0]
    assert model.roi_heads.box_roi_pool.scales == [0.25, 0.125, 0.0625, 0.03125]
    assert len(alone["boxes"]) > 0 and all(torch.equal(alone[k], after[k]) for k in alone)
