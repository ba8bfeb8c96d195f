"""Ranks out of step, made for real on 2 gloo ranks: the scenarios and what each rank records.

Rank 1 is the odd one. Each scenario ends with both ranks having issued the same collectives (rank 1 makes up for
what it skipped), so the group stays usable; what differs is which of rank 0's exchanges each of rank 1's meets:
- eval_one_step: rank 1 takes step 1 (forward and backward) in eval mode. Its step 2 then meets rank 0's step 1.
  Before each step both ranks also run an eval-mode forward without backward (rank 1 twice, rank 0 once, grad on):
  evaluating on some ranks must not count.
- sync_every: `configure_sync(sync_every=2)` on rank 1 only: its forward 2 meets rank 0's forward 1.
- skipped_layer: at step 1 rank 1 runs the model without `bn1` (bn2 has the same width), so its bn2 meets rank 0's
  bn1; afterwards it runs bn1 alone once. The steps are forwards in training mode under torch.no_grad (as precise
  BN recalibration runs them): with a backward, the two ranks' collectives would no longer pair by size after the
  skip and gloo would abort instead.
- in_step: the same steps on both ranks, with the eval-mode forward on rank 1 only (no backward): nothing found.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from src.syncbn import SyncBatchNormOutOfStepError, check_in_step, configure_sync, convert_sync_batchnorm
from src.syncbn import out_of_step_layers

SCENARIOS = ("eval_one_step", "sync_every", "skipped_layer", "in_step")
# Steps per rank: rank 1 makes up for what its odd behaviour skipped (see the module docstring).
STEPS = {"eval_one_step": (3, 4), "sync_every": (3, 5), "skipped_layer": (2, 2), "in_step": (3, 3)}


class Net(nn.Module):
    """conv-BN-ReLU(inplace) twice (both BatchNorms 4 wide), pooled, linear: converted, so bn1, bn2 are numbered."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.conv2, self.bn2 = nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))

    def forward(self, x: torch.Tensor, skip_bn1: bool = False) -> torch.Tensor:
        x = self.conv1(x)
        if not skip_bn1:
            x = self.bn1(x)
        x = torch.relu_(x)
        return self.head(torch.relu_(self.bn2(self.conv2(x))))


def build(device: str, exchange: str = "all_reduce") -> nn.Module:
    """The model in float64 with our SyncBatchNorm layers (numbered by the conversion), the same on every rank."""
    torch.manual_seed(0)
    model = convert_sync_batchnorm(Net()).to(device=device, dtype=torch.float64)
    model.bn1.exchange = model.bn2.exchange = exchange
    return model


def _batch(step: int, rank: int, device: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(100 * step + rank)
    return (3.0 + torch.randn(2 + rank, 3, 5, 5, generator=gen, dtype=torch.float64)).to(device)


def _check(model: nn.Module) -> Optional[str]:
    """check_in_step's error message, or None."""
    try:
        check_in_step(model)
    except SyncBatchNormOutOfStepError as err:
        return str(err)
    return None


def run_scenario(rank: int, world: int, payload: dict[str, Any]) -> dict[str, Any]:
    """One scenario on this rank: per step whether the output and the running variances are finite and what
    check_in_step said after it; the layers found at the end, and what payload["then"] (a function of (model,
    rank), if given) returns."""
    name, device = payload["scenario"], payload["device"]
    model = build(device, payload.get("exchange", "all_reduce"))
    odd = rank == 1
    if name == "sync_every" and odd:
        configure_sync(model, sync_every=2)
    steps = []
    for step in range(STEPS[name][rank]):
        x = _batch(step, rank, device)
        if name in ("eval_one_step", "in_step"):  # evaluation on some ranks, autograd on, no backward: not a step
            model.eval()
            for _ in range(1 + int(odd)):
                model(x)
            model.train()
        if name == "eval_one_step" and odd and step == 1:
            model.eval()
        if name == "skipped_layer":
            with torch.no_grad():
                y = model(x, skip_bn1=odd and step == 1)
        else:
            y = model(x)
            y.sum().backward()
        model.train()
        steps.append({"y_finite": bool(torch.isfinite(y).all()),
                      "running_var_finite": all(bool(torch.isfinite(bn.running_var).all())
                                                for bn in (model.bn1, model.bn2)),
                      "error": _check(model)})
    if name == "skipped_layer" and odd:
        with torch.no_grad():
            model.bn1(torch.randn(3, 4, 5, 5, dtype=torch.float64, device=device))
    record = {"steps": steps, "found": [(f.name, f.call) for f in out_of_step_layers(model)]}
    then = payload.get("then")
    if then is not None:
        record["then"] = then(model, rank)
    return record


# scenario -> (per rank: the steps whose exchanges met another call, so their output is NaN; the layers found)
EXPECTED = {
    "eval_one_step": (([1, 2], [2, 3]), ["bn1", "bn2"]),
    "sync_every": (([1, 2], [2, 4]), ["bn1", "bn2"]),
    "skipped_layer": (([1], [1]), ["bn1", "bn2"]),
    "in_step": (([], []), []),
}


def check_scenario(name: str, results: list[dict[str, Any]]) -> None:
    """Every rank: NaN exactly at the expected steps, flagged from the first of them on, naming a layer and the
    causes; at the end, the layers found, earliest first."""
    bad_steps, layers = EXPECTED[name]
    for rank, record in enumerate(results):
        first_bad = bad_steps[rank][0] if bad_steps[rank] else None
        for step, got in enumerate(record["steps"]):
            where = f"{name}, rank {rank}, step {step}"
            assert got["y_finite"] == (step not in bad_steps[rank]), f"{where}: output finite={got['y_finite']}"
            flagged = first_bad is not None and step >= first_bad
            assert got["running_var_finite"] == (not flagged), f"{where}: running_var: {got['running_var_finite']}"
            if not flagged:
                assert got["error"] is None, f"{where}: false positive: {got['error']}"
                continue
            assert got["error"] is not None, f"{where}: out of step, but check_in_step raised nothing"
            assert "SyncBatchNorm's ranks are out of step: layer 'bn" in got["error"], got["error"]
            assert "eval mode" in got["error"] and "configure_sync" in got["error"] and "skipped" in got["error"]
        assert [n for n, _ in record["found"]] == layers, f"{name}, rank {rank}: {record['found']}"
