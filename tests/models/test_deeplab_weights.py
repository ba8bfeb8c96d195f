"""DeepLab's weights: a whole-model file, a torchvision ResNet file or weights name for its backbone (from the
cache, offline, and the clear errors when missing), strict and non-strict loading (the helpers and fixtures:
tests/models/test_weights.py, tests/models/test_pretrained.py)."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from torchvision.models import resnet18

from src.models import build_model
from src.models.config import model_config
from tests.models.test_pretrained import BN, _assert_loaded, _torchvision_file, caches, no_network  # noqa: F401
from tests.models.test_weights import equal_states

DEEPLAB = {"name": "deeplabv3_resnet18", "output_stride": 16, "aux_loss_weight": 0.5, "head_channels": 16}


def test_whole_model_weights_file(tmp_path: Path) -> None:
    torch.manual_seed(1)
    source = build_model(DEEPLAB, {}, 3)
    path = tmp_path / "model.pth"
    torch.save(source.state_dict(), path)
    torch.manual_seed(2)
    loaded = build_model({**DEEPLAB, "weights": str(path)}, {"name": "syncbn"}, 3)
    assert equal_states(loaded.state_dict(), source.state_dict())


def test_backbone_weights_from_a_torchvision_resnet_file(tmp_path: Path) -> None:
    torch.manual_seed(3)
    imagenet = resnet18(weights=None)  # stands in for torchvision's resnet18-f37072fd.pth (fc: 1000 classes)
    path = tmp_path / "resnet18.pth"
    torch.save(imagenet.state_dict(), path)
    expected = {k: v for k, v in imagenet.state_dict().items() if not k.startswith("fc.")}
    model = build_model({**DEEPLAB, "backbone_weights": str(path)}, {}, 3)
    assert equal_states(model.backbone.state_dict(), expected)


def test_strict_mismatch_is_an_error_nonstrict_loads_what_matches(tmp_path: Path, caplog) -> None:
    source = build_model(DEEPLAB, {}, 21)  # e.g. VOC weights, fine-tuned on 3 classes
    path = tmp_path / "voc.pth"
    torch.save(source.state_dict(), path)
    with pytest.raises(ValueError, match=r"model.weights: .* does not match the model .*shape mismatch: "
                                         r"classifier.4.weight: \(21, 16, 1, 1\) in file vs \(3, 16, 1, 1\)"
                                         r".*model.weights_strict=false"):
        build_model({**DEEPLAB, "weights": str(path)}, {}, 3)
    with caplog.at_level(logging.WARNING, logger="src.models.weights"):
        model = build_model({**DEEPLAB, "weights": str(path), "weights_strict": False}, {}, 3)
    assert "shape mismatch" in caplog.text and "strict=False" in caplog.text
    mine, theirs = model.state_dict(), source.state_dict()
    skipped = {"classifier.4.weight", "classifier.4.bias", "aux_classifier.4.weight", "aux_classifier.4.bias"}
    assert all(torch.equal(mine[k], theirs[k]) for k in mine if k not in skipped)
    assert not torch.equal(mine["classifier.4.bias"][:3], theirs["classifier.4.bias"][:3])  # fresh, not loaded


def test_backbone_by_name(caches: tuple[Path, Path], no_network: None) -> None:
    state = _torchvision_file(caches[0], "resnet18")
    seg = build_model({"name": "deeplabv3_resnet18", "backbone_weights": "DEFAULT", "aux_loss_weight": 0.0}, BN, 5)
    assert _assert_loaded(seg.backbone, state, skip=("fc.",)) == len(state) - 2


def test_offline_missing_backbone_file_fails_at_config_validation(caches: tuple[Path, Path], no_network: None,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="resnet18-f37072fd.pth"):
        model_config(name="deeplabv3_resnet18", backbone_weights="DEFAULT").validate()
    _torchvision_file(caches[0], "resnet18")
    model_config(name="deeplabv3_resnet18", backbone_weights="DEFAULT").validate()


def test_missing_file_and_failed_download_names_the_path(caches: tuple[Path, Path], no_network: None) -> None:
    """Not declared offline: the library tries to download; its failure is the same clear error."""
    with pytest.raises(FileNotFoundError, match="downloading them failed") as err:
        build_model({"name": "deeplabv3_resnet18", "backbone_weights": "IMAGENET1K_V1"}, BN, 5)
    assert str(caches[0] / "hub" / "checkpoints" / "resnet18-f37072fd.pth") in str(err.value)


def test_whole_model_weights_by_name_are_refused() -> None:
    with pytest.raises(ValueError, match="model.backbone_weights=DEFAULT"):
        model_config(name="deeplabv3_resnet18", weights="DEFAULT").validate()
