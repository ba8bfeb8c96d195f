"""Loading weights (local files, or state_dicts of named weights from src/models/pretrained.py) with a report of
what matched."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
from torch import nn

from src.errors import MissingFileError, UserError

log = logging.getLogger(__name__)


@dataclass
class LoadReport:
    """What a weights file contributed: loaded keys, and keys missing / unexpected / with another shape."""

    path: str
    loaded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)  # "key: file shape vs model shape"
    ignored: list[str] = field(default_factory=list)  # dropped on purpose (e.g. a classifier's fc.*)

    @property
    def complete(self) -> bool:
        """True when every model tensor came from the file and nothing in the file was left over."""
        return not (self.missing or self.unexpected or self.mismatched)

    def summary(self) -> str:
        """One line for the log; lists a few keys of each problem kind."""
        def few(keys: list[str]) -> str:
            return ", ".join(keys[:5]) + (f", ... ({len(keys)} in all)" if len(keys) > 5 else "")
        parts = [f"{len(self.loaded)} tensors loaded from {self.path}"]
        for label, keys in (("missing", self.missing), ("unexpected", self.unexpected),
                            ("shape mismatch", self.mismatched), ("ignored", self.ignored)):
            if keys:
                parts.append(f"{label}: {few(keys)}")
        return "; ".join(parts)


def read_state_dict(path: str) -> dict[str, torch.Tensor]:
    """Tensors of a weights file: a bare state_dict (.pth / .bin / .safetensors), or a checkpoint holding one
    under "model"/"state_dict"."""
    path = os.path.expanduser(path)
    if not os.path.isfile(path):
        raise MissingFileError(f"weights file not found: {path!r}. Nothing is downloaded (offline): copy the "
                               "file there (e.g. torchvision's resnet50-0676ba61.pth) or fix the path")
    if path.endswith(".safetensors"):  # timm's / Hugging Face's format (safetensors comes with timm)
        from safetensors.torch import load_file

        obj: Any = load_file(path, device="cpu")
    else:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("model", "state_dict"):
        if isinstance(obj, Mapping) and isinstance(obj.get(key), Mapping):
            obj = obj[key]
            break
    if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise UserError(f"{path!r} holds no state_dict (expected a dict of tensors, or a checkpoint with a "
                        "'model' or 'state_dict' entry)")
    # Checkpoints saved from a DDP-wrapped model prefix every key with "module.".
    return {k[len("module."):] if k.startswith("module.") else k: v for k, v in obj.items()}


def load_weights(module: nn.Module, path: str, *, strict: bool = True, ignore_prefixes: tuple[str, ...] = (),
                 what: str = "model.weights") -> LoadReport:
    """Copy the tensors of `path` into `module`. strict: any missing/unexpected/mismatched key is an error
    naming them; non-strict: load the matching tensors and log what was skipped. Keys under
    ignore_prefixes (file or model side, e.g. a classifier's "fc.") are neither loaded nor reported."""
    return apply_state_dict(module, read_state_dict(path), path, strict=strict, ignore_prefixes=ignore_prefixes,
                            what=what)


def apply_state_dict(module: nn.Module, state: Mapping[str, torch.Tensor], source: str, *, strict: bool = True,
                     ignore_prefixes: tuple[str, ...] = (), what: str = "model.weights") -> LoadReport:
    """load_weights for tensors already read (`source` names where they came from in the report)."""
    path = source
    report = LoadReport(path=path)
    report.ignored = sorted(k for k in state if k.startswith(ignore_prefixes)) if ignore_prefixes else []
    own = module.state_dict()
    usable: dict[str, torch.Tensor] = {}
    wrong_shape: set[str] = set()
    for key, value in state.items():
        if key in report.ignored:
            continue
        if key not in own:
            report.unexpected.append(key)
        elif own[key].shape != value.shape:
            wrong_shape.add(key)
            report.mismatched.append(f"{key}: {tuple(value.shape)} in file vs {tuple(own[key].shape)}")
        else:
            usable[key] = value
    report.missing = [k for k in own if k not in usable and k not in wrong_shape
                      and not (ignore_prefixes and k.startswith(ignore_prefixes))]
    report.loaded = sorted(usable)
    if strict and not report.complete:
        raise ValueError(f"{what}: {path!r} does not match the model ({report.summary()}). Check model.name, "
                         f"model.output_stride, model.aux_loss_weight and norm, or set model.weights_strict=false "
                         "to load only the matching tensors")
    module.load_state_dict(usable, strict=False)
    (log.info if report.complete else log.warning)("%s: %s (strict=%s)", what, report.summary(), strict)
    return report
