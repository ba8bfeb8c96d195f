#!/usr/bin/env python
"""GPU benchmark: our SyncBN CUDA kernels against PyTorch's SyncBN kernels and cuDNN batch norm.

Single process (the collectives are not timed: on one GPU they are identity). Compared, per shape,
layout (NCHW, channels_last) and dtype (float32, bfloat16 with fp32 parameters as under AMP):
  ours_ops      our five ops chained as src/syncbn/functions.py does (stats, gather+running update,
                elemt; backward_reduce, backward_elemt)
  ours_module   src.syncbn.SyncBatchNorm2d forward/backward through autograd
  torch_kernels the torch.batch_norm_* kernels chained as nn.SyncBatchNorm does (batch_norm_stats,
                packing, batch_norm_gather_stats_with_counts, batch_norm_elemt; batch_norm_backward_reduce,
                packing, batch_norm_backward_elemt), without its host-side mask of empty ranks (a sync)
  cudnn         F.batch_norm(training=True) forward/backward through autograd
Times are medians of per-iteration CUDA-event timings after warm-up. Effective bandwidth counts the
minimum traffic of the two-pass algorithm: forward reads x twice and writes y (3 tensors), forward +
backward adds reading x and dy twice and writing dx (8 tensors); it is reported as a fraction of a
device-to-device copy measured in the same run.

    python scripts/bench_syncbn_cuda.py [--json OUT.json] [--iters 50] [--quick]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = [(32, 256, 56, 56), (64, 64, 112, 112), (32, 64, 56, 56), (32, 2048, 16, 16), (4, 64, 16, 16)]
LAYOUTS = {"nchw": torch.contiguous_format, "channels_last": torch.channels_last}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
EPS, MOMENTUM = 1e-5, 0.1


def time_ms(fn: Callable[[], object], warmup: int, iters: int) -> float:
    """Median milliseconds of fn() over `iters` runs, each bracketed by CUDA events."""
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def copy_bandwidth_gbps(warmup: int, iters: int) -> float:
    """Device-to-device copy bandwidth (read + write bytes per second) on a 1 GiB buffer."""
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), warmup, iters)
    return 2 * src.numel() / (ms * 1e-3) / 1e9


def make_impls(ops, x: torch.Tensor, dy: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor):
    """{name: (forward_fn, forward_backward_fn)} on the same data and parameters."""
    from src.syncbn import SyncBatchNorm2d

    c = x.shape[1]
    acc_double = x.dtype == torch.float64
    rm, rv = torch.zeros(c, device="cuda"), torch.ones(c, device="cuda")
    nbt = torch.zeros((), dtype=torch.long, device="cuda")

    def ours_fwd():
        stats = ops.batch_norm_stats(x)
        mean, invstd, count = ops.batch_norm_gather_stats(stats.view(1, -1), rm, rv, nbt, MOMENTUM, EPS, acc_double)
        return ops.batch_norm_elemt(x, weight, bias, mean, invstd), mean, invstd, count

    def ours_fwd_bwd():
        y, mean, invstd, count = ours_fwd()
        reduced = ops.batch_norm_backward_reduce(dy, x, mean, invstd)
        return y, ops.batch_norm_backward_elemt(dy, x, mean, invstd, weight, reduced, count)

    def torch_fwd():
        # nn.SyncBatchNorm.forward's kernels and packing (the all_gather and its host-side mask of
        # empty ranks left out: identity on one process, and the mask would only add a sync).
        mean, invstd = torch.batch_norm_stats(x, EPS)
        count = torch.full((1,), x.numel() // c, dtype=mean.dtype, device=mean.device)
        combined = torch.cat([mean, invstd, count], dim=0).view(1, -1)
        mean_all, invstd_all, count_all = torch.split(combined, c, dim=1)
        mean, invstd = torch.batch_norm_gather_stats_with_counts(
            x, mean_all, invstd_all, rm, rv, MOMENTUM, EPS, count_all.view(-1))
        return torch.batch_norm_elemt(x, weight, bias, mean, invstd, EPS), mean, invstd, count_all

    def torch_fwd_bwd():
        y, mean, invstd, count_all = torch_fwd()
        sum_dy, sum_dy_xmu, _, _ = torch.batch_norm_backward_reduce(dy, x, mean, invstd, weight, True, True, True)
        combined = torch.cat([sum_dy, sum_dy_xmu], dim=0)  # packed for the all_reduce
        sum_dy, sum_dy_xmu = torch.split(combined, c)
        count_tensor = count_all.view(-1).to(torch.int32)
        return y, torch.batch_norm_backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu, count_tensor)

    module = SyncBatchNorm2d(c, eps=EPS, momentum=MOMENTUM).cuda()
    with torch.no_grad():
        module.weight.copy_(weight)
        module.bias.copy_(bias)
    x_req = x.detach().clone().requires_grad_()
    w_req, b_req = weight.detach().clone().requires_grad_(), bias.detach().clone().requires_grad_()

    def module_fwd():
        with torch.no_grad():
            return module(x)

    # autograd.grad, not .backward(): accumulating into .grad would add an x-sized kernel per step.
    def module_fwd_bwd():
        return torch.autograd.grad(module(x_req), (x_req, module.weight, module.bias), dy)

    def cudnn_fwd():
        with torch.no_grad():
            return F.batch_norm(x, rm, rv, weight, bias, True, MOMENTUM, EPS)

    def cudnn_fwd_bwd():
        return torch.autograd.grad(F.batch_norm(x_req, rm, rv, w_req, b_req, True, MOMENTUM, EPS), (x_req, w_req, b_req), dy)

    return {
        "ours_ops": (ours_fwd, ours_fwd_bwd),
        "ours_module": (module_fwd, module_fwd_bwd),
        "torch_kernels": (torch_fwd, torch_fwd_bwd),
        "cudnn": (cudnn_fwd, cudnn_fwd_bwd),
    }, (ours_fwd_bwd, torch_fwd_bwd)


def check_agreement(ours, theirs) -> dict[str, float]:
    """Max |difference| of y and dx between our kernels and PyTorch's (sanity check of the timed code)."""
    y1, dx1 = ours()
    y2, dx2 = theirs()
    return {"max_abs_diff_y": float((y1.float() - y2.float()).abs().max()),
            "max_abs_diff_dx": float((dx1.float() - dx2.float()).abs().max())}


def run(args: argparse.Namespace) -> dict:
    """Benchmark every (shape, layout, dtype) and return the JSON-ready results."""
    from src.syncbn.extension import load_extension

    ops = load_extension()
    torch.backends.cudnn.benchmark = True
    copy_gbps = copy_bandwidth_gbps(args.warmup, args.iters)
    rows = []
    shapes = SHAPES[-2:] if args.quick else SHAPES
    for shape in shapes:
        for lname, fmt in LAYOUTS.items():
            for dname, dtype in DTYPES.items():
                gen = torch.Generator(device="cuda").manual_seed(0)
                x = (torch.randn(shape, generator=gen, device="cuda") + 0.5).to(dtype).contiguous(memory_format=fmt)
                dy = torch.randn(shape, generator=gen, device="cuda").to(dtype).contiguous(memory_format=fmt)
                weight = torch.rand(shape[1], generator=gen, device="cuda") + 0.5
                bias = torch.randn(shape[1], generator=gen, device="cuda")
                impls, pair = make_impls(ops, x, dy, weight, bias)
                nbytes = x.numel() * x.element_size()
                row = {"shape": list(shape), "layout": lname, "dtype": dname, "bytes": nbytes,
                       **check_agreement(*pair)}
                for name, (fwd, fwd_bwd) in impls.items():
                    f_ms = time_ms(fwd, args.warmup, args.iters)
                    fb_ms = time_ms(fwd_bwd, args.warmup, args.iters)
                    f_gbps = 3 * nbytes / (f_ms * 1e-3) / 1e9
                    fb_gbps = 8 * nbytes / (fb_ms * 1e-3) / 1e9
                    row[name] = {"fwd_ms": f_ms, "fwd_bwd_ms": fb_ms, "fwd_gbps": f_gbps, "fwd_bwd_gbps": fb_gbps,
                                 "fwd_frac_copy": f_gbps / copy_gbps, "fwd_bwd_frac_copy": fb_gbps / copy_gbps}
                row["speedup_fwd_bwd_vs_torch_kernels"] = row["torch_kernels"]["fwd_bwd_ms"] / row["ours_ops"]["fwd_bwd_ms"]
                row["speedup_fwd_vs_torch_kernels"] = row["torch_kernels"]["fwd_ms"] / row["ours_ops"]["fwd_ms"]
                rows.append(row)
                print_row(row)
                del impls, pair, x, dy
                torch.cuda.empty_cache()
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "copy_gbps": copy_gbps, "iters": args.iters, "warmup": args.warmup, "rows": rows}


IMPLS = ("ours_ops", "ours_module", "torch_kernels", "cudnn")


def print_header(copy_gbps: float | None = None) -> None:
    if copy_gbps is not None:
        print(f"device copy bandwidth: {copy_gbps:.0f} GB/s (read+write)")
    cols = " ".join(f"{n + ' f/fb ms':>22}" for n in IMPLS)
    print(f"{'shape':>18} {'layout':>13} {'dtype':>8} {cols} {'x torch':>7} {'%copy':>6}")


def print_row(row: dict) -> None:
    cells = " ".join(f"{row[n]['fwd_ms']:>10.3f}/{row[n]['fwd_bwd_ms']:<11.3f}" for n in IMPLS)
    shape = "x".join(map(str, row["shape"]))
    print(f"{shape:>18} {row['layout']:>13} {row['dtype']:>8} {cells} "
          f"{row['speedup_fwd_bwd_vs_torch_kernels']:>7.2f} {100 * row['ours_ops']['fwd_bwd_frac_copy']:>5.0f}%",
          flush=True)


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the benchmark, print the table and optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="only the two smallest shapes")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_syncbn_cuda: no CUDA GPU visible; nothing to measure", file=sys.stderr)
        return 2
    print_header()
    results = run(args)
    print(f"device: {results['device']}, copy bandwidth {results['copy_gbps']:.0f} GB/s; columns: forward / "
          "forward+backward median ms; 'x torch' = torch_kernels / ours_ops (fwd+bwd); '%copy' = ours_ops "
          "fwd+bwd effective bandwidth as a fraction of the copy")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
