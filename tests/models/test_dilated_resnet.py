"""Dilated ResNet backbones: trading stride for dilation keeps the strided network's function.

A conv with stride s followed by 3x3 convs equals (exactly, zero padding included) the same conv with
stride 1 followed by convs dilated by s, sampled every s pixels. So in eval mode the OS8/OS16 backbone's
layer4 output sampled at [::4, ::4] / [::2, ::2] must equal torchvision's strided ResNet's layer4 output
with the same weights. This fails if any conv of a dilated stage has the wrong dilation (e.g. the first
BasicBlock's conv2 left at the previous dilation, as torchvision's _make_layer would pass).
"""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torchvision.models import resnet as tv_resnet
from torchvision.models._utils import IntermediateLayerGetter

from src.models.resnet import DilatedBasicBlock, build_dilated_resnet


def layer4(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return IntermediateLayerGetter(model, {"layer4": "out"})(x)["out"]


@pytest.mark.parametrize("name", ["resnet18", "resnet50"])  # basic block and bottleneck
@pytest.mark.parametrize(("dilate", "step"), [((False, True, True), 4), ((False, False, True), 2)])
def test_dilated_equals_strided_subsampled(name: str, dilate: tuple, step: int) -> None:
    strided = getattr(tv_resnet, name)(weights=None).eval()
    with torch.no_grad():  # non-trivial BN statistics so a norm mix-up would show
        for m in strided.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
    dilated = build_dilated_resnet(name, nn.BatchNorm2d, dilate).eval()
    dilated.load_state_dict(strided.state_dict())  # strict: same keys as torchvision's BasicBlock/Bottleneck
    strided, dilated = strided.double(), dilated.double()
    x = torch.randn(1, 3, 64, 64, dtype=torch.float64)
    with torch.no_grad():
        ref, out = layer4(strided, x), layer4(dilated, x)
    assert out.shape[-1] == 64 // (32 // step)  # output stride 8 or 16
    # float64: only summation order differs (measured ~3e-13 on activations ~100). In float32 that rounding,
    # amplified through 30+ layers, reaches ~1e-3 and would blur the test; a wrong dilation gives O(1).
    torch.testing.assert_close(out[..., ::step, ::step], ref, rtol=1e-9, atol=1e-9)


def test_torchvision_basicblock_rejects_dilation_ours_accepts() -> None:
    with pytest.raises(NotImplementedError, match="Dilation > 1 not supported in BasicBlock"):
        tv_resnet.BasicBlock(8, 8, dilation=2)
    block = DilatedBasicBlock(8, 8, dilation=2)
    assert block.conv1.dilation == block.conv2.dilation == (2, 2) and block.conv2.padding == (2, 2)
    assert block(torch.randn(1, 8, 9, 9)).shape == (1, 8, 9, 9)


def test_first_block_conv2_gets_the_new_dilation() -> None:
    model = build_dilated_resnet("resnet18", nn.BatchNorm2d, (False, True, True))
    assert model.layer3[0].conv1.dilation == (1, 1) and model.layer3[0].conv2.dilation == (2, 2)
    assert model.layer4[0].conv1.dilation == (2, 2) and model.layer4[0].conv2.dilation == (4, 4)
    assert model.layer4[1].conv1.dilation == (4, 4)
