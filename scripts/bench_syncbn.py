"""CPU benchmark of the SyncBN kernels against torch.nn.functional.batch_norm (training mode).

    python scripts/bench_syncbn.py [--shapes 32x64x56x56,...] [--dtypes float32,bfloat16]
                                   [--formats nchw,channels_last] [--json out.json] [--world-size 2]

For every case, in the same run: our forward (stats -> merge -> elementwise, via the ops) and
forward+backward (+ backward reduce -> backward elementwise), the same through the
src.syncbn.SyncBatchNorm2d module (autograd included), and F.batch_norm forward and forward+backward
(autograd), timed round-robin. Effective bandwidth counts the minimum traffic: 3 passes of the
tensor for the forward (stats read x; elemt reads x, writes y) and 8 for forward+backward (backward
reduce reads x and dy; backward elemt reads x and dy, writes dx), against the copy bandwidth
(`out.copy_(x)`, 2 passes) measured in the same run. `--world-size 2` spawns 2 gloo processes and
reports what the collectives add per layer (SyncBatchNorm2d on 2 ranks vs 1 rank, same per-rank batch).
Numbers are medians; on a shared machine they are noisy. Never used as test assertions.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from src.syncbn.extension import load_extension  # noqa: E402

DEFAULT_SHAPES = "32x64x56x56,32x256x28x28,64x64x32x32,32x2048x7x7"
FORMATS = {"nchw": torch.contiguous_format, "channels_last": torch.channels_last}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


def timeit(fn, repeats: int, warmup: int) -> float:
    """Median wall time of fn() in seconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def timeit_interleaved(fns: dict, repeats: int, warmup: int) -> dict:
    """Median wall time of each fn, timed round-robin so that load from other processes on a
    shared machine hits every contender alike (sequential blocks would bias the ratios)."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def ops_forward(ops, x, w, b):
    """Our forward through the raw ops (one process: the gather is the local row)."""
    stats = ops.batch_norm_stats(x)
    mean, invstd, count = ops.batch_norm_gather_stats(stats[None], None, None, None, 0.1, 1e-5,
                                                      x.dtype == torch.float64)
    return ops.batch_norm_elemt(x, w, b, mean, invstd), mean, invstd, count


def ops_forward_backward(ops, x, w, b, dy):
    """Our forward + backward through the raw ops (dweight/dbias come from `reduced`)."""
    y, mean, invstd, count = ops_forward(ops, x, w, b)
    reduced = ops.batch_norm_backward_reduce(dy, x, mean, invstd)
    return y, ops.batch_norm_backward_elemt(dy, x, mean, invstd, w, reduced, count)


def make_module(c: int, dtype: torch.dtype):
    """src.syncbn.SyncBatchNorm2d if the module exists yet, else None."""
    try:
        from src.syncbn import SyncBatchNorm2d
    except ImportError:
        return None
    return SyncBatchNorm2d(c)


def bench_case(ops, shape, dtype, fmt_name, repeats, warmup) -> dict:
    """Times one (shape, dtype, format) case; returns a result row."""
    fmt = FORMATS[fmt_name]
    x = torch.randn(shape, dtype=torch.float32).to(dtype).contiguous(memory_format=fmt)
    dy = torch.randn(shape, dtype=torch.float32).to(dtype).contiguous(memory_format=fmt)
    c = shape[1]
    w, b = torch.rand(c) + 0.5, torch.randn(c)
    rm, rv = torch.zeros(c), torch.ones(c)
    nbytes = x.numel() * x.element_size()
    out = torch.empty_like(x)
    row = dict(shape="x".join(map(str, shape)), dtype=str(dtype).split(".")[-1], format=fmt_name,
               mbytes=nbytes / 1e6)

    def torch_fwd():
        with torch.no_grad():
            return F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5)

    xg = x.detach().requires_grad_(True)
    wg, bg = w.clone().requires_grad_(True), b.clone().requires_grad_(True)

    def torch_fwdbwd():
        y = F.batch_norm(xg, rm, rv, wg, bg, training=True, momentum=0.1, eps=1e-5)
        y.backward(dy)

    fns = {"copy": lambda: out.copy_(x),
           "ours_fwd": lambda: ops_forward(ops, x, w, b),
           "ours_fwdbwd": lambda: ops_forward_backward(ops, x, w, b, dy),
           "torch_fwd": torch_fwd, "torch_fwdbwd": torch_fwdbwd}
    module = make_module(c, dtype)
    if module is not None:
        module.train()

        def module_fwd():
            with torch.no_grad():
                return module(x)

        fns["module_fwd"] = module_fwd
        fns["module_fwdbwd"] = lambda: module(xg).backward(dy)
    times = timeit_interleaved(fns, repeats, warmup)
    copy_bw = 2 * nbytes / times.pop("copy")
    row["copy_gbs"] = copy_bw / 1e9
    row.update(times)
    bound_fwd, bound_fwdbwd = 3 * nbytes / copy_bw, 8 * nbytes / copy_bw
    row["ratio_fwd"] = row["ours_fwd"] / row["torch_fwd"]
    row["ratio_fwdbwd"] = row["ours_fwdbwd"] / row["torch_fwdbwd"]
    row["ours_fwdbwd_gbs"] = 8 * nbytes / row["ours_fwdbwd"] / 1e9
    row["ours_fwdbwd_vs_bound"] = row["ours_fwdbwd"] / bound_fwdbwd
    row["ours_fwd_vs_bound"] = row["ours_fwd"] / bound_fwd
    return row


def print_table(rows: list[dict]) -> None:
    """Prints the results as a Markdown table (times in ms)."""
    has_module = any("module_fwdbwd" in r for r in rows)
    head = ["shape", "dtype", "format", "copy GB/s", "ours fwd", "torch fwd", "fwd ratio", "ours f+b",
            "torch f+b", "f+b ratio", "ours f+b GB/s", "f+b / 8-pass bound"]
    if has_module:
        head[9:9] = ["module f+b"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        cells = [r["shape"], r["dtype"], r["format"], f"{r['copy_gbs']:.1f}", f"{r['ours_fwd']*1e3:.2f}",
                 f"{r['torch_fwd']*1e3:.2f}", f"{r['ratio_fwd']:.2f}", f"{r['ours_fwdbwd']*1e3:.2f}",
                 f"{r['torch_fwdbwd']*1e3:.2f}", f"{r['ratio_fwdbwd']:.2f}", f"{r['ours_fwdbwd_gbs']:.1f}",
                 f"{r['ours_fwdbwd_vs_bound']:.2f}"]
        if has_module:
            cells[9:9] = [f"{r['module_fwdbwd']*1e3:.2f}" if "module_fwdbwd" in r else "-"]
        print("| " + " | ".join(cells) + " |")


def _collective_worker(rank: int, world: int, port: int, cases: list, repeats: int, warmup: int, queue) -> None:
    """One gloo rank: times SyncBatchNorm2d fwd+bwd per case (the group of `world` processes)."""
    import torch.distributed as dist

    from src.syncbn import SyncBatchNorm2d

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results = []
        for shape, dtype_name, fmt_name in cases:
            dtype = DTYPES[dtype_name]
            x = torch.randn(shape).to(dtype).contiguous(memory_format=FORMATS[fmt_name]).requires_grad_(True)
            dy = torch.randn(shape).to(dtype).contiguous(memory_format=FORMATS[fmt_name])
            m = SyncBatchNorm2d(shape[1]).train()

            def step():
                m(x).backward(dy)
                dist.barrier()  # ranks start each repeat together

            results.append(timeit(step, repeats, warmup))
        if rank == 0:
            queue.put(results)
    finally:
        dist.destroy_process_group()


def collective_overhead(cases: list, repeats: int, warmup: int) -> list[float]:
    """Per case: (2-rank time - 1-rank time) of SyncBatchNorm2d fwd+bwd, same per-rank batch."""
    import socket

    import torch.multiprocessing as mp

    times = {}
    for world in (1, 2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        procs = [ctx.Process(target=_collective_worker, args=(r, world, port, cases, repeats, warmup, queue))
                 for r in range(world)]
        for p in procs:
            p.start()
        times[world] = queue.get(timeout=1800)
        for p in procs:
            p.join(timeout=120)
    return [t2 - t1 for t1, t2 in zip(times[1], times[2])], times


def main() -> None:
    """Parse options, run the cases, print the table, optionally write JSON."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma-separated NxCxHxW")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--formats", default="nchw,channels_last")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: PyTorch's default)")
    p.add_argument("--world-size", type=int, default=1, choices=(1, 2),
                   help="2: also measure the collectives' added time per layer on 2 gloo processes")
    p.add_argument("--json", type=Path, default=None, help="write the rows as JSON here")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    ops = load_extension()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    cases = [(s, d, f) for s in shapes for d in args.dtypes.split(",") for f in args.formats.split(",")]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}; times in ms (median of {args.repeats})")
    rows = [bench_case(ops, s, DTYPES[d], f, args.repeats, args.warmup) for s, d, f in cases]
    print_table(rows)
    result = {"threads": torch.get_num_threads(), "torch": torch.__version__, "rows": rows}
    if args.world_size == 2:
        added, times = collective_overhead(cases, max(5, args.repeats // 2), args.warmup)
        print("\nSyncBatchNorm2d fwd+bwd, 1 thread per rank, same per-rank batch: 2 ranks vs 1")
        print("| shape | dtype | format | 1 rank ms | 2 ranks ms | added by collectives ms |")
        print("|---|---|---|---|---|---|")
        for (s, d, f), t1, t2 in zip(cases, times[1], times[2]):
            print(f"| {'x'.join(map(str, s))} | {d} | {f} | {t1*1e3:.2f} | {t2*1e3:.2f} | {(t2-t1)*1e3:.2f} |")
        result["collectives"] = [dict(shape="x".join(map(str, s)), dtype=d, format=f, one_rank=t1, two_ranks=t2)
                                 for (s, d, f), t1, t2 in zip(cases, times[1], times[2])]
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
