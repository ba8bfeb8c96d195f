"""torch.compile(fullgraph=True) of a model with our SyncBN on 2 real gloo processes equals eager mode.

One run on 2 ranks does every phase (starting Python + torch in the workers costs seconds; Inductor's C++
compiles cost more, so only one phase uses Inductor). Each phase trains a float64 model with SyncBN
layers of every kind (momentum=0.1, momentum=None, track_running_stats=False, affine=False) compiled
with fullgraph=True, step by step next to an eager copy of it (same initial weights, same data, SGD),
and compares outputs, input grads, parameter grads and every buffer (running statistics,
num_batches_tracked) after every step.

Tolerance (float64): compiled code runs the same kernels, but Inductor fuses and reorders the
elementwise work around them, so results differ by rounding only (observed <= 3e-14 absolute on these
O(1) values); 1e-9 relative / 1e-11 absolute is far above that and far below what a wrong statistic or
gradient gives (>= 1e-3).

Also checked: no graph breaks, one graph per phase over all steps (no recompilation) where the
shapes stay the same, and that the compiled graphs hold exactly two all_reduces per SyncBN layer in the forward and
one per layer in the backward, no all_gather and no host read (the eager counter, collectives.call_counts, is not
incremented by compiled code, so the graphs themselves are counted).
"""
from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import torch
import torch.nn as nn

from src.syncbn import SyncBatchNorm1d, SyncBatchNorm2d
from tests.support.gloo import run_on_ranks

# Inductor compiles on 2 processes: minutes, so the run is part of make test, not the make test-fast loop.
pytestmark = pytest.mark.slow

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
TOL = dict(rtol=1e-9, atol=1e-11)
SYNCBN_LAYERS = 4  # in Net
GATHER = "_c10d_functional.all_gather_into_tensor"
REDUCE = "_c10d_functional.all_reduce"
CHECK = "synctrain.require_more_than_one_value"  # the one-value check, the one operator that reads the host
HOST_READ = "aten._local_scalar_dense"

# name -> (backend, per-step per-rank batch sizes, how many graphs Dynamo may build over the steps)
PHASES = {
    # Uneven batches, same shapes every step: one graph, reused.
    "aot_uneven": ("aot_eager", [[3, 5]] * 3, 1),
    # Rank 1 holds no samples: it still joins every collective, in the compiled graph too.
    "aot_empty_rank": ("aot_eager", [[4, 0]] * 2, 1),
    # Batch sizes change every step: the second size recompiles with a dynamic batch dimension
    # (Dynamo's automatic dynamic shapes), and every later size reuses that graph.
    "aot_changing_batch": ("aot_eager", [[2, 3], [3, 4], [4, 6], [5, 2]], 2),
    # Inductor (C++ kernels on the CPU) around our operators and the functional collectives.
    "inductor_uneven": ("inductor", [[3, 5]] * 2, 1),
    # The same with an empty rank. Inductor's layout optimisation is off here: with it, PyTorch's own
    # convolution_backward returns weight grads in other strides than its meta function says when the
    # batch is empty (Inductor's stride assertion fails for a plain nn.Conv2d net, without SyncBN).
    "inductor_empty_rank": ("inductor", [[4, 0]] * 2, 1),
}
INDUCTOR_CONFIG = {"inductor_empty_rank": {"layout_optimization": False}}
# Safety nets of the run (tests/support/gloo.py), wider than its defaults because compiling is slow and
# uneven here: a cold Inductor compile of both phases took more than 240 s on a loaded 2-core machine, and
# the ranks compile different kernels (different batch sizes), so one may wait in the graph's first
# collective while the other still compiles. pytest's 900 s stays the limit.
SPAWN_TIMEOUTS = dict(deadline_s=600.0, timeout_s=300.0)


class Net(nn.Module):
    """conv-SyncBN-ReLU x2, then linear-SyncBN1d layers: every SyncBN configuration in one graph."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 4, 3), SyncBatchNorm2d(4), nn.ReLU(),
            nn.Conv2d(4, 4, 3), SyncBatchNorm2d(4, momentum=None), nn.ReLU(), nn.Flatten(),
        )
        self.head = nn.Sequential(
            nn.Linear(4 * 4 * 4, 6), SyncBatchNorm1d(6, track_running_stats=False), nn.ReLU(),
            nn.Linear(6, 3), SyncBatchNorm1d(3, affine=False),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def _graph_recorder(graphs: dict[str, list[str]]) -> Any:
    """aot_eager that also keeps the forward and backward graphs' code, to count their collectives.

    With Inductor's partitioner (min-cut): aot_eager's default one copies into the backward graph every node it can
    recompute from saved tensors and keeps those it may not drop, so there the backward re-runs each layer's
    statistics chain up to its first all_reduce (which Dynamo treats as a side effect) and discards the result.
    """
    from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd

    def keep(kind: str):
        def compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
            graphs[kind].append(gm.code)
            return make_boxed_func(gm.forward)
        return compiler

    return aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"),
                        partition_fn=min_cut_rematerialization_partition)


def _step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, g: torch.Tensor) -> dict:
    """One training step; what it computed, and the buffers after it."""
    x = x.clone().requires_grad_()
    y = model(x)
    (y * g).sum().backward()
    rec = {"y": y.detach().cpu(), "dx": x.grad.cpu(),
           "grads": [p.grad.detach().cpu().clone() for p in model.parameters()]}
    opt.step()
    opt.zero_grad(set_to_none=True)
    rec["buffers"] = [b.detach().cpu().clone() for b in model.buffers()]
    return rec


def run_phases(rank: int, world: int, payload: dict) -> dict[str, Any]:
    """On each rank: every phase; compiled and eager records per step, graph counts, code."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code

    device = payload["device"]
    out: dict[str, Any] = {}
    for name, (backend_name, _, _) in PHASES.items():
        torch._dynamo.reset()
        counters.clear()
        torch.manual_seed(0)
        eager = Net().double().to(device)
        model = copy.deepcopy(eager)
        graphs: dict[str, list[str]] = {"forward": [], "backward": []}
        backend = _graph_recorder(graphs) if backend_name == "aot_eager" else backend_name
        compiled = torch.compile(model, fullgraph=True, backend=backend)
        opt_c = torch.optim.SGD(model.parameters(), lr=0.1)
        opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
        steps = []
        with torch._inductor.config.patch(INDUCTOR_CONFIG.get(name, {})):
            for s, step in enumerate(payload["data"][name]):
                x, g = step["x"][rank].to(device), step["g"][rank].to(device)
                if backend_name == "inductor" and s == 0:  # keep the generated code of the first step
                    rec, graphs["inductor"] = run_and_get_code(_step, compiled, opt_c, x, g)
                else:
                    rec = _step(compiled, opt_c, x, g)
                steps.append({"compiled": rec, "eager": _step(eager, opt_e, x, g)})
        out[name] = {"steps": steps, "graphs": graphs, "unique_graphs": counters["stats"]["unique_graphs"],
                     "graph_breaks": dict(counters["graph_break"])}
    out["one_value"] = _one_value_in_group(device, rank)
    return out


def _one_value_in_group(device: str, rank: int) -> str:
    """Rank 0 holds one sample, rank 1 none: compiled, every rank must raise F.batch_norm's ValueError."""
    torch._dynamo.reset()
    layer = torch.compile(SyncBatchNorm1d(3).to(device), fullgraph=True, backend="aot_eager")
    try:
        layer(torch.randn(1 if rank == 0 else 0, 3, device=device))
    except ValueError as exc:
        return str(exc)
    return "no error"


def _data(world: int) -> dict[str, list[dict]]:
    gen = torch.Generator().manual_seed(12)
    data = {}
    for name, (_, sizes, _) in PHASES.items():
        # aot_uneven's inputs sit 1e4 from zero (as raw pixels do): far from the exchange's origin.
        loc = 1e4 if name == "aot_uneven" else 0.0
        data[name] = [{"x": [loc + torch.randn(n, 3, 8, 8, generator=gen, dtype=torch.float64) for n in per_rank],
                       "g": [torch.randn(n, 3, generator=gen, dtype=torch.float64) for n in per_rank]}
                      for per_rank in sizes]
    return data


@pytest.fixture(scope="module", params=DEVICES)
def results(request: pytest.FixtureRequest) -> list[dict]:
    """One run on 2 ranks does every phase; per-rank results."""
    payload = {"device": request.param, "data": _data(2)}
    # fresh=True: processes of this run alone. src/syncbn/fusable.py reads SYNCTRAIN_SYNCBN_FUSE once, at
    # import, so a reused worker would compile whichever fusion its first task's environment chose, not this
    # process's; and compiling leaves Dynamo/Inductor state (caches, Inductor's compile-worker processes,
    # hundreds of MB of imports) that no later task on a shared worker should inherit.
    return run_on_ranks(2, run_phases, payload, fresh=True, **SPAWN_TIMEOUTS)


def _count(code: str, op: str, called: bool = False) -> int:
    """Uses of `op` in a graph's code: called, or passed to auto_functionalized (a mutating operator such as the
    merge appears as its argument); `called`: calls only (Inductor's code also names ops in comments)."""
    return len(re.findall(re.escape(op) + (r"\w*\.default\(" if called else r"\w*\.default\b"), code))


@pytest.mark.parametrize("phase", list(PHASES))
def test_compiled_equals_eager(results: list[dict], phase: str) -> None:
    for rank, res in enumerate(results):
        for s, step in enumerate(res[phase]["steps"]):
            got, want = step["compiled"], step["eager"]
            where = f"{phase} rank {rank} step {s}"
            torch.testing.assert_close(got["y"], want["y"], **TOL, msg=lambda m: f"{where} output: {m}")
            torch.testing.assert_close(got["dx"], want["dx"], **TOL, msg=lambda m: f"{where} input grad: {m}")
            for i, (a, b) in enumerate(zip(got["grads"], want["grads"], strict=True)):
                torch.testing.assert_close(a, b, **TOL, msg=lambda m: f"{where} grad of parameter {i}: {m}")
            for i, (a, b) in enumerate(zip(got["buffers"], want["buffers"], strict=True)):
                torch.testing.assert_close(a, b, **TOL, msg=lambda m: f"{where} buffer {i}: {m}")


@pytest.mark.parametrize("phase", list(PHASES))
def test_fullgraph_without_breaks_or_recompiles(results: list[dict], phase: str) -> None:
    expected_graphs = PHASES[phase][2]
    for rank, res in enumerate(results):
        assert res[phase]["graph_breaks"] == {}, f"{phase} rank {rank}: {res[phase]['graph_breaks']}"
        assert res[phase]["unique_graphs"] == expected_graphs, \
            f"{phase} rank {rank}: {res[phase]['unique_graphs']} graphs for {len(res[phase]['steps'])} steps"


def _checks_expected(phase: str, rank: int) -> int:
    """One-value checks a rank's forward graph holds: one per layer where its batch is empty (it holds at most one
    value per channel, so it reads the global count), none where it holds more."""
    return SYNCBN_LAYERS if PHASES[phase][1][0][rank] == 0 else 0


@pytest.mark.parametrize("phase", [p for p, (backend, _, _) in PHASES.items() if backend == "aot_eager"])
def test_graphs_hold_two_collectives_per_layer_forward_one_backward(results: list[dict], phase: str) -> None:
    for rank, res in enumerate(results):
        graphs = res[phase]["graphs"]
        assert graphs["forward"] and len(graphs["forward"]) == len(graphs["backward"])
        for fw, bw in zip(graphs["forward"], graphs["backward"]):
            assert (_count(fw, GATHER), _count(fw, REDUCE)) == (0, 2 * SYNCBN_LAYERS), f"{phase} rank {rank} forward"
            assert (_count(bw, GATHER), _count(bw, REDUCE)) == (0, SYNCBN_LAYERS), f"{phase} rank {rank} backward"
            # No host read in the graphs, and the one-value check (an operator that reads inside) only on an empty rank.
            assert (_count(fw, CHECK), _count(bw, CHECK)) == (_checks_expected(phase, rank), 0), f"{phase} rank {rank}"
            assert (_count(fw, HOST_READ), _count(bw, HOST_READ)) == (0, 0), f"{phase} rank {rank}"


@pytest.mark.parametrize("phase", [p for p, (backend, _, _) in PHASES.items() if backend == "inductor"])
def test_inductor_code_keeps_every_collective(results: list[dict], phase: str) -> None:
    for rank, res in enumerate(results):
        code = "\n".join(res[phase]["graphs"]["inductor"])
        counts = (_count(code, GATHER, True), _count(code, REDUCE, True), _count(code, CHECK, True))
        assert counts == (0, 3 * SYNCBN_LAYERS, _checks_expected(phase, rank)), f"{phase} rank {rank}"


def test_one_value_in_the_whole_group_raises_on_every_rank(results: list[dict]) -> None:
    for rank, res in enumerate(results):
        assert "Expected more than 1 value per channel when training" in res["one_value"], f"rank {rank}"
