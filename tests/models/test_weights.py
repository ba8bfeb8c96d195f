"""Local weights files: whole-model and backbone loading, strict and non-strict, clear errors."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from torchvision.models import resnet18

from src.models import build_model, load_weights

def equal_states(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_checkpoint_with_model_entry_and_ddp_prefix(tmp_path: Path) -> None:
    source = build_model({"name": "resnet20"}, {}, 10)
    path = tmp_path / "ckpt.pt"
    torch.save({"model": {f"module.{k}": v for k, v in source.state_dict().items()}, "epoch": 3}, path)
    loaded = build_model({"name": "resnet20", "weights": str(path)}, {"name": "frozen_bn"}, 10)
    assert equal_states(loaded.state_dict(), source.state_dict())


def test_backbone_weights_from_a_torchvision_resnet_file(tmp_path: Path) -> None:
    torch.manual_seed(3)
    imagenet = resnet18(weights=None)  # stands in for torchvision's resnet18-f37072fd.pth (fc: 1000 classes)
    path = tmp_path / "resnet18.pth"
    torch.save(imagenet.state_dict(), path)
    expected = {k: v for k, v in imagenet.state_dict().items() if not k.startswith("fc.")}
    # Classification fine-tuning with another class count: everything but fc comes from the file.
    clf = build_model({"name": "resnet18", "backbone_weights": str(path)}, {}, 7)
    assert equal_states({k: v for k, v in clf.state_dict().items() if not k.startswith("fc.")}, expected)
    assert clf.fc.out_features == 7


def test_report_lists_missing_and_unexpected(tmp_path: Path) -> None:
    model = build_model({"name": "resnet20"}, {}, 10)
    state = model.state_dict()
    state.pop("fc.bias")
    state["extra.weight"] = torch.zeros(1)
    path = tmp_path / "partial.pth"
    torch.save(state, path)
    report = load_weights(model, str(path), strict=False)
    assert report.missing == ["fc.bias"] and report.unexpected == ["extra.weight"] and not report.complete
    with pytest.raises(ValueError, match="missing: fc.bias; unexpected: extra.weight"):
        load_weights(model, str(path), strict=True)


def test_missing_file_and_non_state_dict(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="weights file not found: .*Nothing is downloaded"):
        load_weights(build_model({"name": "resnet20"}, {}, 10), str(tmp_path / "nope.pth"))
    path = tmp_path / "junk.pth"
    torch.save([1, 2, 3], path)
    with pytest.raises(ValueError, match="holds no state_dict"):
        build_model({"name": "resnet20", "weights": str(path)}, {}, 10)


def test_weights_files_false_skips_files_that_are_gone(tmp_path: Path) -> None:
    """Evaluation / resume rebuild the model from a stored config and then load the checkpoint."""
    cfg = {"name": "resnet20", "weights": str(tmp_path / "moved_away.pth")}
    with pytest.raises(ValueError, match="model.weights: no file at"):
        build_model(cfg, {}, 10)
    model = build_model(cfg, {}, 10, weights_files=False)
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 10)
