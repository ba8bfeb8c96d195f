"""What the out-of-step check costs a SyncBN layer, in the same run: its own ops, and a step with and without it.

    python scripts/bench_exchange_check.py [--shapes 32x64x8x8,...] [--rounds 15] [--steps 20] [--json OUT.json]

1. The check's ops alone, in this process: per channel count C of the shapes, one layer-forward's worth of what
   the check adds (src/syncbn/exchange_tag.py: count the call, build the first all_reduce's payload with the
   identity, and, on the payload the all_reduce returns when every rank is in step, the verdict, the NaN fill and
   the first-call record), against the same stand-in for the collective without them; the median over --rounds
   rounds of 1000 calls of the difference in this thread's CPU time (microseconds), and the operators added.
2. The layer's training step with and without it, on 2 gloo processes on loopback (one torch thread each; rank
   0's times; a barrier before each block). Per shape (float32, NCHW), every round times --steps forward +
   backward steps of each design back to back, the order alternating between rounds:
     checked    a SyncBatchNorm2d's training step as its forward makes it (src.syncbn.functions.sync_batch_norm
                with the layer's exchange tag, counted): 4 values more in the first all_reduce, the ops above
     unchecked  the same, without the tag: the exchange as it was before the check
   Reported: the medians over rounds of the wall time per step and of rank 0's CPU time per step (its thread's:
   waiting in a collective does not count, nor do other processes), the median of the per-round ratios checked /
   unchecked, the CPU time added, the operators one step dispatches, and the host reads of one checked step
   (aten._local_scalar_dense and the other reading operators: scripts/bench_exchange_host.py's dispatch counter).
Prints Markdown tables and writes the JSON. On a loaded machine the wall times drown the check in the
collectives' noise (milliseconds on loopback gloo); the CPU times and part 1 are its cost.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

REPO = Path(__file__).resolve().parents[1]
for _path in (REPO, REPO / "scripts"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

DEFAULT_SHAPES = "32x64x8x8,32x64x56x56,32x256x14x14,32x2048x7x7"
DESIGNS = ("checked", "unchecked")


def _steps(layer: Any, x: torch.Tensor, dy: torch.Tensor) -> dict[str, Callable[[], None]]:
    """The two designs' steps on the same layer: both as SyncBatchNorm.forward runs them in training, through
    sync_batch_norm, one with the layer's exchange tag (counted as the layer counts it) and one without."""
    from src.syncbn.collectives import resolve_group
    from src.syncbn.functions import sync_batch_norm

    def step(checked: bool) -> None:
        layer.num_batches_tracked.add_(1)
        name, size = resolve_group(None)
        identity = first = None
        if checked:
            tag = layer._tag(x.device)
            tag.count_call()
            identity, first = tag.identity, tag.first_out_of_step
        sync_batch_norm(x, layer.weight, layer.bias, layer.running_mean, layer.running_var, layer.num_batches_tracked,
                        0.1, layer.eps, name, size, None, None, "all_reduce", identity, first).backward(dy)

    return {"checked": lambda: step(True), "unchecked": lambda: step(False)}


def _host_reads(step: Callable[[], None]) -> int:
    from bench_exchange_host import count_host_reads  # the same dispatch counter as that bench

    return count_host_reads(step)


def _rows(shapes: list[tuple[int, ...]], rounds: int, steps: int, barrier: Callable[[], None]) -> list[dict[str, Any]]:
    """Per shape, the per-round ms per step of both designs and the host reads of one checked step."""
    from src.syncbn import SyncBatchNorm2d

    out = []
    for shape in shapes:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(shape, generator=gen).requires_grad_()
        dy = torch.randn(shape, generator=gen)
        layer = SyncBatchNorm2d(shape[1]).train()
        fns = _steps(layer, x, dy)
        for fn in fns.values():  # warm-up
            fn()
        times: dict[str, list[float]] = {d: [] for d in DESIGNS}
        cpu: dict[str, list[float]] = {d: [] for d in DESIGNS}
        for r in range(rounds):
            for design in DESIGNS if r % 2 == 0 else DESIGNS[::-1]:
                barrier()
                start, start_cpu = time.perf_counter(), time.thread_time()
                for _ in range(steps):
                    fns[design]()
                cpu[design].append((time.thread_time() - start_cpu) / steps * 1e3)
                times[design].append((time.perf_counter() - start) / steps * 1e3)
        out.append({"shape": "x".join(map(str, shape)), "ms": times, "cpu_ms": cpu,
                    "host_reads_checked": _host_reads(fns["checked"]), "ops": {d: _count_ops(fns[d]) for d in DESIGNS}})
    return out


def _gloo_worker(rank: int, port: int, shapes: list[tuple[int, ...]], rounds: int, steps: int, queue: Any) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        rows = _rows(shapes, rounds, steps, dist.barrier)
        if rank == 0:
            queue.put(rows)
    finally:
        dist.destroy_process_group()


def _gloo(shapes: list[tuple[int, ...]], rounds: int, steps: int) -> list[dict[str, Any]]:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_gloo_worker, args=(r, port, shapes, rounds, steps, queue)) for r in range(2)]
    for p in procs:
        p.start()
    rows = queue.get(timeout=3600)
    for p in procs:
        p.join(timeout=120)
    return rows


def ops_alone(channels: int, world_size: int, rounds: int) -> dict[str, float]:
    """Microseconds the check adds per layer-forward (part 1 of the module docstring), C channels, W ranks."""
    from src.syncbn.exchange_tag import ExchangeTag, checked_mean_sums, reduce_payload

    tag = ExchangeTag(torch.device("cpu"), 1)
    mean_sums = torch.randn(channels + 1, dtype=torch.float64)

    def checked() -> None:
        tag.count_call()
        payload = reduce_payload(tag.identity, world_size, mean_sums)
        reduced = payload * world_size  # what the all_reduce returns when every rank sent the same identity
        checked_mean_sums(reduced, payload, world_size, tag.identity, tag.first_out_of_step)

    def unchecked() -> None:
        mean_sums * world_size  # the same stand-in for the collective

    times: dict[str, list[float]] = {"checked": [], "unchecked": []}
    for r in range(rounds):
        for name, fn in (("checked", checked), ("unchecked", unchecked))[:: 1 if r % 2 == 0 else -1]:
            start = time.thread_time()  # this thread's CPU time: other processes' load does not count
            for _ in range(1000):
                fn()
            times[name].append((time.thread_time() - start) * 1e3)  # us per call
    assert math.isinf(float(tag.first_out_of_step[0])), "the stand-in must be in step"
    return {"C": channels, "added_us": statistics.median(c - u for c, u in zip(times["checked"], times["unchecked"])),
            "ops": _count_ops(checked) - _count_ops(unchecked)}


def _count_ops(fn: Callable[[], None]) -> int:
    """Operators one call of fn dispatches (views included)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    count = 0

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
            nonlocal count
            count += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return count


def measure(shapes: list[tuple[int, ...]], rounds: int, steps: int) -> list[dict[str, Any]]:
    """Part 2: both designs' times per shape, with their medians and ratios (see the module docstring)."""
    rows = _gloo(shapes, rounds, steps)
    for row in rows:
        for key, prefix in (("ms", ""), ("cpu_ms", "cpu_")):
            t = row[key]
            row[f"{prefix}checked_ms"] = statistics.median(t["checked"])
            row[f"{prefix}unchecked_ms"] = statistics.median(t["unchecked"])
            row[f"{prefix}ratio"] = statistics.median(c / u for c, u in zip(t["checked"], t["unchecked"]))
            row[f"{prefix}added_us"] = statistics.median(c - u for c, u in zip(t["checked"], t["unchecked"])) * 1e3
    return rows


def main(argv: list[str] | None = None) -> int:
    """Measure, print the tables, write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma-separated NxCxHxW (float32, NCHW)")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--steps", type=int, default=20, help="steps per design per round (part 2)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    from src.syncbn.functions import kernel_ops

    torch.set_num_threads(1)
    kernel_ops()  # build or load the kernels here, once, before the ranks load them
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    alone = [ops_alone(c, 2, args.rounds) for c in sorted({s[1] for s in shapes})]
    print(f"torch {torch.__version__}, 1 thread. The check's own ops per layer-forward (W = 2), medians over "
          f"{args.rounds} rounds of 1000:")
    print("| C | added CPU us per layer-forward | added operators (views included) |")
    print("|---|---|---|")
    for a in alone:
        print(f"| {a['C']} | {a['added_us']:.1f} | {a['ops']} |")
    rows = measure(shapes, args.rounds, args.steps)
    print(f"\nSyncBatchNorm2d forward + backward, float32 NCHW, 2 gloo ranks: medians over {args.rounds} rounds of "
          f"{args.steps} steps")
    print("| shape | wall ms/step checked / unchecked | wall ratio | rank 0's CPU ms/step checked / unchecked | "
          "CPU ratio | CPU us added | operators per step checked / unchecked | host reads (checked) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['checked_ms']:.3f} / {r['unchecked_ms']:.3f} | {r['ratio']:.3f} | "
              f"{r['cpu_checked_ms']:.3f} / {r['cpu_unchecked_ms']:.3f} | {r['cpu_ratio']:.3f} | "
              f"{r['cpu_added_us']:.1f} | {r['ops']['checked']} / {r['ops']['unchecked']} | "
              f"{r['host_reads_checked']} |")
    if args.json is not None:
        args.json.write_text(json.dumps({"ops_alone": alone, "steps": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
