"""CPU benchmark of the SyncBN kernels against torch.nn.functional.batch_norm and nn.BatchNorm (training mode).

    python scripts/bench_syncbn.py [--shapes 32x64x56x56,100352x64,...] [--dtypes float32,bfloat16]
                                   [--formats nchw,channels_last] [--threads 1] [--clock cpu]
                                   [--base-library DIR] [--json out.json] [--world-size 2]

For every case, in the same run: our forward (stats -> merge -> elementwise, via the ops) and
forward+backward (+ backward reduce -> backward elementwise), the same through the src.syncbn.SyncBatchNorm
module of the input's dimension (autograd included), F.batch_norm forward and forward+backward (autograd), and
nn.BatchNorm's module of the same dimension, timed round-robin: each repeat runs every contender once (in a new
random order), so load from other processes hits them alike; with glibc, freed memory is kept for reuse, as in a
long-running training process, so that no contender pays another's page faults. Shapes of 4 dims run in each of
--formats; any other (NxC, NxCxL, NxCxDxHxW) runs contiguous (format "nc" for (N, C): channels innermost). Times are
medians over the repeats; ratios are medians of the per-repeat ratios (steadier than a ratio of medians when the
machine's load changes during a run).
Effective bandwidth counts the minimum traffic: 3 passes of the tensor for the forward (stats read x; elemt reads
x, writes y) and 8 for forward+backward (backward reduce reads x and dy; backward elemt reads x and dy, writes dx),
against the copy bandwidth (`out.copy_(x)`, 2 passes) measured in the same run.
--base-library DIR also times the raw ops of another build of the kernels (a build folder of another checkout,
e.g. build/torch_extensions/syncbn_cpu_avx512_<hash>) in the same rounds: before/after ratios from one run.
--clock cpu times each call by the thread's CPU time (time.thread_time; needs --threads 1) instead of wall time:
on a machine shared with other jobs, time spent descheduled then counts for no contender.
`--world-size 2` spawns 2 gloo processes and reports what the collectives add per layer (SyncBatchNorm on 2
ranks vs 1 rank, same per-rank batch). The header prints the CPU model and the load average before and after.
Numbers are medians; on a shared machine they are noisy. Never used as test assertions.
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import importlib.util
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType

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


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def timeit_interleaved(fns: dict, repeats: int, warmup: int, clock=time.perf_counter) -> dict[str, list[float]]:
    """Each fn's times over `repeats` rounds, each round running every contender once, so that load from other
    processes on a shared machine hits every contender alike (sequential blocks would bias the ratios). Each round
    runs them in a new random order (seeded): in a fixed cycle each contender always follows the same one, and
    what that one leaves in the caches, or frees for the next allocation, biased a contender by up to 20%."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    order = list(fns)
    shuffle = random.Random(0).shuffle
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        shuffle(order)
        for k in order:
            t0 = clock()
            fns[k]()
            times[k].append(clock() - t0)
    return times


def keep_freed_memory() -> None:
    """glibc only: keep freed blocks for reuse (no munmap or trim), as a long-running training process's heap does
    after its first steps. Otherwise a tensor of tens of MB may land on fresh pages or on reused ones from one call
    to the next, and whichever contender gets fresh pages pays their page faults (up to 4 ms for 25 MB)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    libc.mallopt(m_mmap_threshold, 1 << 30)
    libc.mallopt(m_trim_threshold, 1 << 30)


def median_ratio(times: dict[str, list[float]], num: str, den: str) -> float:
    """Median over the rounds of times[num] / times[den] (the two ran in the same rounds)."""
    return statistics.median(a / b for a, b in zip(times[num], times[den]))


def load_library(build_dir: str) -> ModuleType:
    """A built kernel library (its .so) from a build folder, e.g. another checkout's build/torch_extensions/NAME."""
    so = sorted(glob.glob(str(Path(build_dir) / "*.so")))
    if not so:
        raise SystemExit(f"no kernel library (.so) in {build_dir}")
    spec = importlib.util.spec_from_file_location(Path(so[0]).name.split(".")[0], so[0])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cpu_model() -> str:
    """The CPU's model name as lscpu prints it (Linux), else what Python knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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


def make_modules(c: int, dim: int):
    """(src.syncbn.SyncBatchNormXd, nn.BatchNormXd) for inputs of `dim` dimensions, both in training mode."""
    from src.syncbn import SyncBatchNorm1d, SyncBatchNorm2d, SyncBatchNorm3d

    ours, theirs = {2: (SyncBatchNorm1d, torch.nn.BatchNorm1d), 3: (SyncBatchNorm1d, torch.nn.BatchNorm1d),
                    4: (SyncBatchNorm2d, torch.nn.BatchNorm2d), 5: (SyncBatchNorm3d, torch.nn.BatchNorm3d)}[dim]
    return ours(c).train(), theirs(c).train()


def case_formats(shape: tuple[int, ...], formats: list[str]) -> list[str]:
    """The formats a shape runs in: 4-D shapes each of `formats`, others their contiguous layout ("nc" for (N, C))."""
    if len(shape) == 4:
        return formats
    return ["nc" if len(shape) == 2 else "contiguous"]


def bench_case(ops, shape, dtype, fmt_name, repeats, warmup, clock=time.perf_counter, base=None) -> dict:
    """Times one (shape, dtype, format) case; returns a result row."""
    fmt = FORMATS.get(fmt_name, torch.contiguous_format)
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

    module, batchnorm = make_modules(c, len(shape))
    module, batchnorm = module.to(dtype), batchnorm.to(dtype)

    def no_grad(layer):
        def run():
            with torch.no_grad():
                return layer(x)
        return run

    fns = {"copy": lambda: out.copy_(x),
           "ours_fwd": lambda: ops_forward(ops, x, w, b),
           "ours_fwdbwd": lambda: ops_forward_backward(ops, x, w, b, dy),
           "torch_fwd": torch_fwd, "torch_fwdbwd": torch_fwdbwd,
           "module_fwd": no_grad(module), "module_fwdbwd": lambda: module(xg).backward(dy),
           "bn_fwd": no_grad(batchnorm), "bn_fwdbwd": lambda: batchnorm(xg).backward(dy)}
    if base is not None:
        fns["base_fwd"] = lambda: ops_forward(base, x, w, b)
        fns["base_fwdbwd"] = lambda: ops_forward_backward(base, x, w, b, dy)
    times = timeit_interleaved(fns, repeats, warmup, clock)
    med = {k: statistics.median(v) for k, v in times.items()}
    copy_bw = 2 * nbytes / med.pop("copy")
    row["copy_gbs"] = copy_bw / 1e9
    row.update(med)
    bound_fwd, bound_fwdbwd = 3 * nbytes / copy_bw, 8 * nbytes / copy_bw
    row["ratio_fwd"] = median_ratio(times, "ours_fwd", "torch_fwd")
    row["ratio_fwdbwd"] = median_ratio(times, "ours_fwdbwd", "torch_fwdbwd")
    row["module_vs_bn_fwd"] = median_ratio(times, "module_fwd", "bn_fwd")
    row["module_vs_bn_fwdbwd"] = median_ratio(times, "module_fwdbwd", "bn_fwdbwd")
    if base is not None:
        row["base_ratio_fwd"] = median_ratio(times, "base_fwd", "torch_fwd")
        row["base_ratio_fwdbwd"] = median_ratio(times, "base_fwdbwd", "torch_fwdbwd")
    row["ours_fwdbwd_gbs"] = 8 * nbytes / row["ours_fwdbwd"] / 1e9
    row["ours_fwdbwd_vs_bound"] = row["ours_fwdbwd"] / bound_fwdbwd
    row["ours_fwd_vs_bound"] = row["ours_fwd"] / bound_fwd
    return row


def print_table(rows: list[dict]) -> None:
    """Prints the results as a Markdown table (times in ms)."""
    has_base = any("base_ratio_fwd" in r for r in rows)
    head = ["shape", "dtype", "format", "copy GB/s", "ours fwd", "torch fwd", "fwd ratio", "ours f+b", "torch f+b",
            "f+b ratio", "module fwd", "BatchNorm fwd", "module/BN fwd", "module f+b", "BatchNorm f+b",
            "module/BN f+b", "ours f+b GB/s", "f+b / 8-pass bound"]
    if has_base:
        head[10:10] = ["base fwd ratio", "base f+b ratio"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        cells = [r["shape"], r["dtype"], r["format"], f"{r['copy_gbs']:.1f}", f"{r['ours_fwd']*1e3:.2f}",
                 f"{r['torch_fwd']*1e3:.2f}", f"{r['ratio_fwd']:.2f}", f"{r['ours_fwdbwd']*1e3:.2f}",
                 f"{r['torch_fwdbwd']*1e3:.2f}", f"{r['ratio_fwdbwd']:.2f}", f"{r['module_fwd']*1e3:.2f}",
                 f"{r['bn_fwd']*1e3:.2f}", f"{r['module_vs_bn_fwd']:.2f}", f"{r['module_fwdbwd']*1e3:.2f}",
                 f"{r['bn_fwdbwd']*1e3:.2f}", f"{r['module_vs_bn_fwdbwd']:.2f}", f"{r['ours_fwdbwd_gbs']:.1f}",
                 f"{r['ours_fwdbwd_vs_bound']:.2f}"]
        if has_base:
            cells[10:10] = [f"{r['base_ratio_fwd']:.2f}" if "base_ratio_fwd" in r else "-",
                            f"{r['base_ratio_fwdbwd']:.2f}" if "base_ratio_fwdbwd" in r else "-"]
        print("| " + " | ".join(cells) + " |")


def _collective_worker(rank: int, world: int, port: int, cases: list, repeats: int, warmup: int, queue) -> None:
    """One gloo rank: times SyncBatchNorm fwd+bwd per case (the group of `world` processes)."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results = []
        for shape, dtype_name, fmt_name in cases:
            dtype = DTYPES[dtype_name]
            fmt = FORMATS.get(fmt_name, torch.contiguous_format)
            x = torch.randn(shape).to(dtype).contiguous(memory_format=fmt).requires_grad_(True)
            dy = torch.randn(shape).to(dtype).contiguous(memory_format=fmt)
            m = make_modules(shape[1], len(shape))[0].to(dtype)

            def step():
                m(x).backward(dy)
                dist.barrier()  # ranks start each repeat together

            results.append(timeit(step, repeats, warmup))
        if rank == 0:
            queue.put(results)
    finally:
        dist.destroy_process_group()


def collective_overhead(cases: list, repeats: int, warmup: int) -> list[float]:
    """Per case: (2-rank time - 1-rank time) of SyncBatchNorm fwd+bwd, same per-rank batch."""
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
    p.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma-separated NxC, NxCxL, NxCxHxW or NxCxDxHxW")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--formats", default="nchw,channels_last", help="for 4-D shapes (others run contiguous)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: PyTorch's default)")
    p.add_argument("--clock", choices=tuple(CLOCKS), default="wall",
                   help="cpu: the calling thread's CPU time (needs --threads 1)")
    p.add_argument("--base-library", default=None,
                   help="build folder of another kernel library whose raw ops also run (before/after in one run)")
    p.add_argument("--world-size", type=int, default=1, choices=(1, 2),
                   help="2: also measure the collectives' added time per layer on 2 gloo processes")
    p.add_argument("--json", type=Path, default=None, help="write the rows as JSON here")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.clock == "cpu" and torch.get_num_threads() != 1:
        raise SystemExit("--clock cpu times the calling thread only: run it with --threads 1")
    keep_freed_memory()
    ops = load_extension()
    base = load_library(args.base_library) if args.base_library else None
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    formats = [f for f in args.formats.split(",") if f]
    cases = [(s, d, f) for s in shapes for d in args.dtypes.split(",") for f in case_formats(s, formats)]
    load_before = os.getloadavg()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, {cpu_model()}; {args.clock} clock; times in ms (median of "
          f"{args.repeats}); load average {load_before[0]:.2f}")
    rows = [bench_case(ops, s, DTYPES[d], f, args.repeats, args.warmup, CLOCKS[args.clock], base) for s, d, f in cases]
    print_table(rows)
    load_after = os.getloadavg()
    print(f"load average after: {load_after[0]:.2f}")
    result = {"threads": torch.get_num_threads(), "torch": torch.__version__, "cpu": cpu_model(), "clock": args.clock,
              "load_average": [load_before[0], load_after[0]], "rows": rows}
    if args.world_size == 2:
        added, times = collective_overhead(cases, max(5, args.repeats // 2), args.warmup)
        print("\nSyncBatchNorm fwd+bwd, 1 thread per rank, same per-rank batch: 2 ranks vs 1")
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
