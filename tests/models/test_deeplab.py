"""DeepLabV3 / V3+: output shapes at OS8 and OS16 with and without the aux head; torchvision compatibility."""
from __future__ import annotations

import pytest
import torch
from torchvision.models.segmentation import deeplabv3_resnet50
from torchvision.models.segmentation.deeplabv3 import DeepLabHead

from src.models import build_model
from src.models.deeplab import deeplab_head


@pytest.mark.parametrize("variant", ["deeplabv3", "deeplabv3plus"])
@pytest.mark.parametrize("output_stride", [8, 16])
@pytest.mark.parametrize("aux", [0.0, 0.4])
def test_output_shapes(variant: str, output_stride: int, aux: float) -> None:
    cfg = {"name": f"{variant}_resnet18", "output_stride": output_stride, "aux_loss_weight": aux,
           "head_channels": 32}
    model = build_model(cfg, {"name": "bn"}, 4)
    assert (model.aux_classifier is None) == (aux == 0)
    x = torch.randn(2, 3, 35, 49)  # odd sizes: the logits must still come back at the input size
    out = model(x)
    assert set(out) == ({"out", "aux"} if aux else {"out"})
    assert all(v.shape == (2, 4, 35, 49) for v in out.values())
    # The stride really is the configured one: layer4 features at 1/output_stride of the input.
    features = model.backbone(torch.randn(1, 3, 64, 64))
    assert features["out"].shape[-2:] == (64 // output_stride, 64 // output_stride)
    if variant == "deeplabv3plus":
        assert features["low_level"].shape[-2:] == (16, 16)  # layer1: output stride 4
    out["out"].mean().backward()  # every head gets gradients
    assert all(p.grad is not None for p in model.classifier.parameters())


def test_aspp_rates_follow_output_stride() -> None:
    rates = {}
    for os_ in (8, 16):
        model = build_model({"name": "deeplabv3_resnet18", "output_stride": os_, "head_channels": 16}, {}, 2)
        aspp = model.classifier[0]
        rates[os_] = [conv[0].dilation[0] for conv in list(aspp.convs)[1:4]]
    assert rates == {8: [12, 24, 36], 16: [6, 12, 18]}


def test_deeplabv3plus_decoder_layout() -> None:
    model = build_model({"name": "deeplabv3plus_resnet50", "head_channels": 256}, {}, 5)
    head = model.classifier
    assert head.project[0].in_channels == 256 and head.project[0].out_channels == 48  # layer1 of ResNet-50
    assert head.fuse[0].in_channels == 256 + 48 and head.fuse[0].kernel_size == (3, 3)
    assert head.fuse[3].kernel_size == (3, 3) and head.classifier.out_channels == 5


@pytest.mark.parametrize("norm", ["bn", "syncbn"])
def test_stride2_decoder_uses_the_stem_and_keeps_the_stride4_layout(norm: str) -> None:
    """decoder_stride=2: logits at 1/2 of the input from a stage on the stem's features; the rest unchanged."""
    base = {"name": "deeplabv3plus_resnet18", "output_stride": 16, "aux_loss_weight": 0.5, "head_channels": 32}
    torch.manual_seed(0)
    model = build_model({**base, "decoder_stride": 2}, {"name": norm}, 4)
    stride4 = build_model(base, {"name": norm}, 4).state_dict()
    extra = {k: v.shape for k, v in model.state_dict().items() if k not in stride4}
    assert all(k.startswith(("classifier.project_fine.", "classifier.refine.")) for k in extra) and extra
    assert model.classifier.project_fine[0].in_channels == 64  # the stem's conv1 output
    assert model.classifier.refine[0].in_channels == 32 + 16 and model.classifier.classifier.in_channels == 16
    assert type(model.classifier.refine[1]).__name__ == type(model.classifier.fuse[1]).__name__  # norm injected
    seen = {}
    model.classifier.classifier.register_forward_hook(lambda mod, args, out: seen.setdefault("logits", out))
    x = torch.randn(2, 3, 35, 49)
    out = model(x)
    assert seen["logits"].shape[-2:] == (18, 25)  # stem: ceil(35/2), ceil(49/2)
    assert all(v.shape == (2, 4, 35, 49) for v in out.values())
    out["out"].mean().backward()
    assert model.classifier.project_fine[0].weight.grad.abs().sum() > 0


def test_head_layout_is_torchvisions() -> None:
    ours, theirs = deeplab_head(512, 7, (12, 24, 36)).state_dict(), DeepLabHead(512, 7).state_dict()
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in theirs.items()}


def test_torchvision_deeplabv3_resnet50_state_dict_loads_strictly() -> None:
    """Same module names and shapes as torchvision's (OS8 + aux): its COCO weights file would load."""
    with torch.device("meta"):
        theirs = deeplabv3_resnet50(weights=None, weights_backbone=None, num_classes=21, aux_loss=True)
        ours = build_model({"name": "deeplabv3_resnet50", "output_stride": 8, "aux_loss_weight": 0.5}, {}, 21)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}


def test_batch_of_one_trains_with_gn() -> None:
    """Batch-independent norms work with one image per process (BN's 1x1 ASPP pooling branch would not)."""
    model = build_model({"name": "deeplabv3_resnet18", "head_channels": 16}, {"name": "gn", "num_groups": 8}, 3)
    model.train()
    assert model(torch.randn(1, 3, 32, 32))["out"].shape == (1, 3, 32, 32)


@pytest.mark.parametrize("name", ["deeplabv3_resnet18", "resnet50"])
def test_zero_init_residual_reaches_torchvision_blocks(name: str) -> None:
    """torchvision zero-inits BasicBlock.bn2 / Bottleneck.bn3; our dilated block must still qualify."""
    model = build_model({"name": name, "zero_init_residual": True, "head_channels": 16}, {"name": "gn"}, 3)
    last = [m.bn2 if hasattr(m, "conv2") and not hasattr(m, "conv3") else m.bn3
            for m in model.modules() if type(m).__name__ in ("DilatedBasicBlock", "Bottleneck")]
    assert last and all(not norm.weight.any() for norm in last)
