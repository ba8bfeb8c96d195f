"""Parameter groups: backbone vs heads (head LR multiplier), no weight decay on norms and biases."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from src.models import NORM_TYPES, build_model, no_decay_parameter_names, param_groups


def names_of(model: nn.Module, params: list) -> set[str]:
    ids = {id(p) for p in params}
    return {n for n, p in model.named_parameters() if id(p) in ids}


def test_no_decay_split_covers_norms_and_biases_only() -> None:
    model = build_model({"name": "resnet20"}, {"name": "gn"}, 10)
    groups = param_groups(model, 2.0, weight_decay=5e-4, no_decay_norm_bias=True)
    by_name = {g["name"]: g for g in groups}
    assert set(by_name) == {"backbone", "backbone_no_decay", "head", "head_no_decay"}
    no_decay = names_of(model, by_name["backbone_no_decay"]["params"] + by_name["head_no_decay"]["params"])
    norm_params = {f"{mn}.{pn}" for mn, m in model.named_modules() if isinstance(m, NORM_TYPES)
                   for pn, _ in m.named_parameters(recurse=False)}
    assert no_decay == norm_params | {"fc.bias"} == no_decay_parameter_names(model)
    assert names_of(model, by_name["head"]["params"]) == {"fc.weight"}
    assert by_name["backbone_no_decay"]["weight_decay"] == 0.0 and by_name["head"]["weight_decay"] == 5e-4
    # Every trainable parameter exactly once, and torch.optim accepts the groups (extra keys are kept).
    all_ids = [id(p) for g in groups for p in g["params"]]
    assert sorted(all_ids) == sorted(id(p) for p in model.parameters()) and len(set(all_ids)) == len(all_ids)
    opt = torch.optim.SGD(groups, lr=0.1, momentum=0.9)
    assert [g["lr_mult"] for g in opt.param_groups] == [g["lr_mult"] for g in groups]


def test_frozen_parameters_are_left_out_and_wrappers_unwrapped() -> None:
    model = build_model({"name": "resnet20"}, {"name": "frozen_bn", "affine_trainable": False}, 10)
    groups = param_groups(model)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert set().union(*(names_of(model, g["params"]) for g in groups)) == trainable
    assert not any("bn" in n for n in trainable)
    # A wrapped model (DataParallel here; DistributedDataParallel is unwrapped the same way) gives the
    # same groups, so the head test still sees `backbone.` / `fc.` names without the `module.` prefix.
    wrapped = param_groups(nn.DataParallel(model))
    assert [[id(p) for p in g["params"]] for g in wrapped] == [[id(p) for p in g["params"]] for g in groups]
    assert [g["name"] for g in groups] == ["backbone", "head"]
    with pytest.raises(ValueError, match="head_lr_mult must be > 0"):
        param_groups(model, 0.0)
