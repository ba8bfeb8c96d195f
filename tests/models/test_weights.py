"""Local weights files: whole-model and backbone loading, strict and non-strict, clear errors."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from torchvision.models import resnet18

from src.models import build_model, load_weights

# part: segmentation
DEEPLAB = {"name": "deeplabv3_resnet18", "output_stride": 16, "aux_loss_weight": 0.5, "head_channels": 16}
# /part


def equal_states(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# part: segmentation
def test_whole_model_weights_file(tmp_path: Path) -> None:
    torch.manual_seed(1)
    source = build_model(DEEPLAB, {}, 3)
    path = tmp_path / "model.pth"
    torch.save(source.state_dict(), path)
    torch.manual_seed(2)
    loaded = build_model({**DEEPLAB, "weights": str(path)}, {"name": "syncbn"}, 3)
    assert equal_states(loaded.state_dict(), source.state_dict())
# /part


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
    # part: segmentation
    model = build_model({**DEEPLAB, "backbone_weights": str(path)}, {}, 3)
    assert equal_states(model.backbone.state_dict(), expected)
    # /part
    # Classification fine-tuning with another class count: everything but fc comes from the file.
    clf = build_model({"name": "resnet18", "backbone_weights": str(path)}, {}, 7)
    assert equal_states({k: v for k, v in clf.state_dict().items() if not k.startswith("fc.")}, expected)
    assert clf.fc.out_features == 7


# part: segmentation
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
# /part


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
