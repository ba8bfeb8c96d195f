"""Equivalence cases: SyncBN on W ranks vs one-process nn.BatchNorm on the concatenated batch.

The parent builds each case (all ranks' data, upstream grads, parameters), the children run our layer
on their slice (`run_cases`), the parent runs the float64 oracle (`oracle`) and `compare` checks
forward output, input grad, weight/bias grads, running stats, num_batches_tracked, output layout and
the collectives: two all_reduces per forward that bring each rank 2C+1 values in all (C+1, then C) and the 4 of
the call's identity, whatever the world size, and no all_gather; one all_reduce of 2C values per backward. Grad
convention checked: each rank's weight/bias grads are its local contributions, so their sum over the group equals
the oracle's grads for the loss sum(y * g).
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from src.syncbn import SyncBatchNorm, SyncBatchNorm1d, SyncBatchNorm2d, SyncBatchNorm3d, collectives
from src.syncbn.exchange_tag import REDUCE_VALUES

CLASSES = {"1d": SyncBatchNorm1d, "2d": SyncBatchNorm2d, "3d": SyncBatchNorm3d, "generic": SyncBatchNorm}
ORACLE_BY_DIM = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d, 5: nn.BatchNorm3d}
FORMATS = {"channels_last": torch.channels_last, "channels_last_3d": torch.channels_last_3d}

# Tolerances (atol, rtol) on y and dx, against a float64 oracle fed the very same input values.
# float64: only summation order differs -> ~1e-15 relative; 1e-10 still catches any real bug.
# float32: fp32 accumulation over <= ~10^3 terms -> a few 1e-6 worst case.
# bfloat16 / float16: the kernels accumulate in fp32 and round y, dx once to the input dtype, so the
# error is half an ulp of the result: rtol of 2 ulps (2^-7 bf16, 2^-9 fp16) plus a small atol.
TOL = {
    torch.float64: (1e-10, 1e-10),
    torch.float32: (2e-5, 1e-5),
    torch.bfloat16: (1e-3, 2.0**-7),
    torch.float16: (2e-4, 2.0**-9),
}
# Statistics and parameter grads are fp32 (acc type) for every non-fp64 input: fp32 tolerance.
STAT_TOL = {torch.float64: (1e-10, 1e-10)}
STAT_TOL_DEFAULT = (1e-4, 1e-5)
# Mean 1e4 x std in fp32: the data's own fp32 spacing near 1e4 is ~1e-3 of a std, so a stable
# (Welford/Chan) kernel is good to ~1e-3 on y; naive sum(x^2) - sum(x)^2 in fp32 is off by O(10-100).
LARGE_MEAN_TOL = (1e-2, 1e-3)
LARGE_MEAN_STAT_TOL = (1e-2, 1e-2)


def make_case(
    name: str,
    cls: str,
    channels: int,
    shapes: list[list[tuple[int, ...]]],
    *,
    dtype: torch.dtype = torch.float32,
    fmt: str = "contiguous",
    kwargs: Optional[dict] = None,
    group: str = "world",
    loc: float = 0.0,
    scale: float = 1.0,
    seed: int = 0,
) -> dict:
    """A case: shapes[step][rank] per-rank input shapes; data ~ loc + scale * N(0, 1) rounded to `dtype`."""
    gen = torch.Generator().manual_seed(seed)
    kwargs = dict(kwargs or {})
    param_dtype = torch.float64 if dtype == torch.float64 else torch.float32  # fp32 params for fp16/bf16
    steps = []
    for per_rank in shapes:
        xs = [(loc + scale * torch.randn(s, generator=gen, dtype=torch.float64)).to(dtype) for s in per_rank]
        gs = [torch.randn(s, generator=gen, dtype=torch.float64).to(dtype) for s in per_rank]
        steps.append({"x": xs, "g": gs})
    affine = kwargs.get("affine", True)
    weight = (0.5 + torch.rand(channels, generator=gen, dtype=torch.float64)).to(param_dtype) if affine else None
    bias = torch.randn(channels, generator=gen, dtype=torch.float64).to(param_dtype) if affine and kwargs.get("bias", True) else None
    return {
        "name": name, "cls": cls, "C": channels, "kwargs": kwargs, "dtype": dtype, "param_dtype": param_dtype,
        "fmt": fmt, "group": group, "steps": steps, "weight": weight, "bias": bias,
        # float32 and narrower hold |mean| >> std with few bits of the spread left; float64 keeps its tolerance.
        "large_mean": abs(loc) > 100 * scale and dtype != torch.float64,
    }


def layout(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """x with the same values in the case's memory layout, as a leaf tensor."""
    if fmt in FORMATS:
        return x.contiguous(memory_format=FORMATS[fmt])
    if fmt == "strided":  # every other channel of a twice-as-wide tensor: not contiguous in any format
        wide = torch.zeros((x.shape[0], 2 * x.shape[1]) + tuple(x.shape[2:]), dtype=x.dtype, device=x.device)
        wide[:, ::2] = x
        return wide[:, ::2]
    return x.contiguous()


def make_groups(world: int) -> dict[str, Any]:
    """Process groups used by the cases; every rank creates every group (new_group is collective)."""
    groups: dict[str, Any] = {"world": (None, list(range(world)))}
    if world == 4:
        pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        singles = [dist.new_group([r]) for r in range(world)]
        rank = dist.get_rank()
        groups["pairs"] = (pairs[rank // 2], [0, 1] if rank < 2 else [2, 3])
        groups["single"] = (singles[rank], [rank])
    return groups


def build_layer(case: dict, group: Any, device: str) -> SyncBatchNorm:
    """Our layer for the case, with the case's parameters."""
    layer = CLASSES[case["cls"]](
        case["C"], **case["kwargs"], process_group=group, device=device, dtype=case["param_dtype"]
    )
    with torch.no_grad():
        if case["weight"] is not None:
            layer.weight.copy_(case["weight"])
        if case["bias"] is not None:
            layer.bias.copy_(case["bias"])
    return layer


def train_step(layer: SyncBatchNorm, case: dict, step: dict, rank: int, device: str) -> dict:
    """One training forward + backward on this rank's slice; returns what `compare` checks."""
    fmt = FORMATS.get(case["fmt"], torch.contiguous_format)
    x = layout(step["x"][rank].clone().to(device), case["fmt"]).requires_grad_()  # a leaf of its own
    g = step["g"][rank].to(device)
    before = dict(collectives.call_counts)
    y = layer(x)
    mid = dict(collectives.call_counts)
    y.backward(g)
    after = dict(collectives.call_counts)
    rec = {
        "y": y.detach().cpu(), "dx": x.grad.detach().cpu(),
        "dw": None if layer.weight is None or layer.weight.grad is None else layer.weight.grad.cpu(),
        "db": None if layer.bias is None or layer.bias.grad is None else layer.bias.grad.cpu(),
        "rm": None if layer.running_mean is None else layer.running_mean.detach().cpu().clone(),
        "rv": None if layer.running_var is None else layer.running_var.detach().cpu().clone(),
        "nbt": None if layer.num_batches_tracked is None else int(layer.num_batches_tracked),
        "y_fmt_kept": y.is_contiguous(memory_format=fmt), "dx_fmt_kept": x.grad.is_contiguous(memory_format=fmt),
        "y_dtype": y.dtype,
        "fwd_calls": {k: mid[k] - before[k] for k in mid}, "bwd_calls": {k: after[k] - mid[k] for k in mid},
    }
    layer.zero_grad(set_to_none=True)
    return rec


def run_case(rank: int, case: dict, groups: dict[str, Any], device: str) -> list[dict]:
    """Run the case's training steps on this rank's slice, one record per step."""
    group, members = groups[case["group"]]
    layer = build_layer(case, group, device)
    return [train_step(layer, case, step, rank, device) for step in case["steps"]]


def run_cases(rank: int, world: int, payload: dict) -> dict[str, Any]:
    """Child entry: every case of the payload on this rank (one spawn for the whole list)."""
    groups = make_groups(world)
    return {case["name"]: run_case(rank, case, groups, payload["device"]) for case in payload["cases"]}


def oracle(case: dict, members: list[int]) -> list[dict]:
    """nn.BatchNorm in float64 on the concatenation of the members' batches, step by step."""
    dim = case["steps"][0]["x"][members[0]].dim()
    kwargs = {k: v for k, v in case["kwargs"].items()}
    bn = ORACLE_BY_DIM[dim](case["C"], **kwargs, dtype=torch.float64)
    with torch.no_grad():
        if case["weight"] is not None:
            bn.weight.copy_(case["weight"].double())
        if case["bias"] is not None:
            bn.bias.copy_(case["bias"].double())
    out = []
    for step in case["steps"]:
        xs = [step["x"][m].double() for m in members]
        x = torch.cat(xs).requires_grad_()
        y = bn(x)
        y.backward(torch.cat([step["g"][m].double() for m in members]))
        sizes = [t.shape[0] for t in xs]
        out.append({
            "y": y.detach().split(sizes), "dx": x.grad.split(sizes),
            "dw": None if bn.weight is None else bn.weight.grad.clone(),
            "db": None if bn.bias is None else bn.bias.grad.clone(),
            "rm": None if bn.running_mean is None else bn.running_mean.clone(),
            "rv": None if bn.running_var is None else bn.running_var.clone(),
            "nbt": None if bn.num_batches_tracked is None else int(bn.num_batches_tracked),
        })
        bn.zero_grad(set_to_none=True)
    return out


def collective_calls(counts: dict[str, int]) -> dict[str, int]:
    """A collectives.call_counts difference without the payload: how many all_gathers and all_reduces."""
    return {key: counts[key] for key in ("all_gather", "all_reduce")}


def check_close(actual: Optional[torch.Tensor], expected: Optional[torch.Tensor], tol: tuple, what: str) -> None:
    """Assert `actual` is finite and within (atol, rtol) = tol of `expected` in float64; None only where expected is."""
    if expected is None:
        assert actual is None, f"{what}: expected None, got a tensor"
        return
    assert actual is not None, f"{what}: got None"
    assert torch.isfinite(actual.double()).all(), f"{what}: non-finite values"
    torch.testing.assert_close(actual.double(), expected.double(), atol=tol[0], rtol=tol[1], msg=lambda m: f"{what}: {m}")


def compare(case: dict, results: list[dict[str, Any]], group_members: list[list[int]]) -> None:
    """Assert each group's ranks match the oracle on its concatenated batch (see module docstring)."""
    tol = LARGE_MEAN_TOL if case["large_mean"] else TOL[case["dtype"]]
    stol = LARGE_MEAN_STAT_TOL if case["large_mean"] else STAT_TOL.get(case["dtype"], STAT_TOL_DEFAULT)
    for members in group_members:
        ref = oracle(case, members)
        for s, exp in enumerate(ref):
            per_rank = [results[m][case["name"]][s] for m in members]
            for i, (m, got) in enumerate(zip(members, per_rank)):
                where = f"{case['name']} step {s} rank {m}"
                assert got["y_dtype"] == case["dtype"], f"{where}: output dtype {got['y_dtype']}"
                check_close(got["y"], exp["y"][i], tol, f"{where} output")
                check_close(got["dx"], exp["dx"][i], tol, f"{where} input grad")
                check_close(got["rm"], exp["rm"], stol, f"{where} running_mean")
                check_close(got["rv"], exp["rv"], stol, f"{where} running_var")
                assert got["nbt"] == exp["nbt"], f"{where}: num_batches_tracked {got['nbt']} != {exp['nbt']}"
                assert got["y_fmt_kept"] and got["dx_fmt_kept"], f"{where}: memory format not kept"
                sync = len(members) > 1
                # The payload: C+1 values and the call's identity, then C, whatever the world size.
                fwd = {"all_gather": 0, "all_reduce": 2 * int(sync),
                       "received": (2 * case["C"] + 1 + REDUCE_VALUES) * int(sync)}
                assert got["fwd_calls"] == fwd, f"{where}: {got['fwd_calls']} != {fwd}"
                bwd = {"all_gather": 0, "all_reduce": int(sync), "received": 2 * case["C"] * int(sync)}
                assert got["bwd_calls"] == bwd, f"{where}: {got['bwd_calls']} != {bwd}"
            for key in ("dw", "db"):
                if exp[key] is None:
                    assert all(g[key] is None for g in per_rank), f"{case['name']}: unexpected {key}"
                    continue
                total = sum(g[key].double() for g in per_rank)  # local grads sum to the global ones
                check_close(total, exp[key], stol, f"{case['name']} step {s} {key} (sum over ranks)")
