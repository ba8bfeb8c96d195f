"""What the out-of-step check costs a SyncBN layer: forward + backward with and without it, on 2 gloo ranks.

    python scripts/bench_exchange_check.py [--shapes 32x64x8x8,...] [--rounds 15] [--steps 20] [--json OUT.json]

Spawns 2 gloo processes on loopback, one torch thread each. Per shape (float32, NCHW), every round times
--steps forward + backward steps of each design back to back, the order alternating between rounds, a barrier
before each block:
  checked    src.syncbn.SyncBatchNorm2d as it trains: its exchange carries the call's identity (4 values more
             in the first all_reduce, about ten small device ops: src/syncbn/exchange_tag.py)
  unchecked  the same layer's tensors through src.syncbn.functions.sync_batch_norm without an identity (the
             exchange as it was before the check)
Reported per shape: the median over rounds of rank 0's ms per step for each design, the median of the per-round
ratio checked / unchecked and the difference in microseconds; and the host reads of one checked step
(aten._local_scalar_dense and the other reading operators: scripts/bench_exchange_host.py's dispatch counter).
Prints a Markdown table and writes the JSON.
"""
from __future__ import annotations

import argparse
import json
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
    from src.syncbn.collectives import resolve_group
    from src.syncbn.functions import sync_batch_norm

    def checked() -> None:
        layer(x).backward(dy)

    def unchecked() -> None:
        layer.num_batches_tracked.add_(1)  # as the layer does
        name, size = resolve_group(None)
        sync_batch_norm(x, layer.weight, layer.bias, layer.running_mean, layer.running_var, layer.num_batches_tracked,
                        0.1, layer.eps, name, size).backward(dy)

    return {"checked": checked, "unchecked": unchecked}


def _host_reads(step: Callable[[], None]) -> int:
    from bench_exchange_host import count_host_reads  # the same dispatch counter as that bench

    return count_host_reads(step)


def _worker(rank: int, port: int, shapes: list[tuple[int, ...]], rounds: int, steps: int, queue: Any) -> None:
    import torch.distributed as dist

    from src.syncbn import SyncBatchNorm2d

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        out = []
        for shape in shapes:
            gen = torch.Generator().manual_seed(rank)
            x = torch.randn(shape, generator=gen).requires_grad_()
            dy = torch.randn(shape, generator=gen)
            layer = SyncBatchNorm2d(shape[1]).train()
            fns = _steps(layer, x, dy)
            for fn in fns.values():  # warm-up
                fn()
            times: dict[str, list[float]] = {d: [] for d in DESIGNS}
            for r in range(rounds):
                for design in DESIGNS if r % 2 == 0 else DESIGNS[::-1]:
                    dist.barrier()
                    start = time.perf_counter()
                    for _ in range(steps):
                        fns[design]()
                    times[design].append((time.perf_counter() - start) / steps)
            out.append({"shape": "x".join(map(str, shape)), "times": times,
                        "host_reads_checked": _host_reads(fns["checked"])})
        if rank == 0:
            queue.put(out)
    finally:
        dist.destroy_process_group()


def measure(shapes: list[tuple[int, ...]], rounds: int, steps: int) -> list[dict[str, Any]]:
    """Rank 0's per-round times of both designs per shape (see the module docstring)."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, port, shapes, rounds, steps, queue)) for r in range(2)]
    for p in procs:
        p.start()
    out = queue.get(timeout=3600)
    for p in procs:
        p.join(timeout=120)
    for row in out:
        t = row["times"]
        row["checked_ms"] = statistics.median(t["checked"]) * 1e3
        row["unchecked_ms"] = statistics.median(t["unchecked"]) * 1e3
        row["ratio"] = statistics.median(c / u for c, u in zip(t["checked"], t["unchecked"]))
        row["added_us"] = statistics.median(c - u for c, u in zip(t["checked"], t["unchecked"])) * 1e6
    return out


def main(argv: list[str] | None = None) -> int:
    """Measure, print the table, write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma-separated NxCxHxW (float32, NCHW)")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--steps", type=int, default=20, help="steps per design per round")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    from src.syncbn.functions import kernel_ops

    kernel_ops()  # build or load the kernels here, once, before the ranks load them
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    rows = measure(shapes, args.rounds, args.steps)
    print(f"torch {torch.__version__}, 2 gloo ranks, 1 thread each; SyncBatchNorm2d forward + backward, float32 NCHW; "
          f"medians over {args.rounds} rounds of {args.steps} steps")
    print("| shape | checked ms/step | unchecked ms/step | checked / unchecked | added us/step | host reads (checked) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['checked_ms']:.3f} | {r['unchecked_ms']:.3f} | {r['ratio']:.3f} | "
              f"{r['added_us']:.1f} | {r['host_reads_checked']} |")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
