"""The variance our statistics kernels give at large |mean| / std, in every layout, against torch.var_mean's.

    python scripts/bench_syncbn_precision.py [--emulated-cuda DEVICE] [--library DIR] [--float64]

Prints, per case (layout, dtype, |mean| / std), the largest relative error over the channels of
batch_norm_stats' variance and of PyTorch's float32 torch.var_mean on the same values, both against float64,
for our CPU kernels (default), the CUDA kernels under the CPU emulation (--emulated-cuda h100, or
"orin,sm_count=1": one SM, so each thread folds many chunks), or a kernel library built elsewhere (--library: the
build folder of another checkout's extension, to compare with an older version). The cases are those of the
kernel tests (tests/syncbn/precision_cases.py), which require ours <= 10x theirs.
--float64: float64 input up to |mean| / std = 1e8 instead, the mean's and the unbiased variance's errors against
exact values, ours and nn.BatchNorm's float64 CPU training forward's (the kernel tests require ours <= 10x theirs).
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.syncbn.precision_cases import (CASES, FLOAT64_LAYOUTS, FLOAT64_RATIOS, float64_errors, make,  # noqa: E402
                                          make_float64, variance_errors)


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


def print_float64(ops: ModuleType) -> None:
    """One row per float64 case: mean and variance relative errors, ours and nn.BatchNorm's, against exact values."""
    print("| layout | abs(mean) / std | mean: ours | mean: nn.BatchNorm | variance: ours | variance: nn.BatchNorm |")
    print("|---|---|---|---|---|---|")
    for layout in FLOAT64_LAYOUTS:
        for ratio in FLOAT64_RATIOS:
            x = make_float64(layout, ratio)
            c = x.shape[1]
            stats = ops.batch_norm_stats(x)
            err = float64_errors(x, stats[1:1 + c], stats[1 + c:] / (x.numel() // c - 1))
            print(f"| {layout} | {ratio:g} | {err['mean'][0]:.1e} | {err['mean'][1]:.1e} | {err['variance'][0]:.1e} "
                  f"| {err['variance'][1]:.1e} |")


def main(argv: list[str] | None = None) -> int:
    """Print one row per case and how many exceed 10x PyTorch's error."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--emulated-cuda", default="", help="run the CUDA kernels under the emulation, on this device")
    p.add_argument("--library", default="", help="a build folder holding another kernel library")
    p.add_argument("--float64", action="store_true",
                   help="float64 input up to |mean| / std = 1e8, against exact values and nn.BatchNorm's float64 error")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.library:
        ops = load_library(args.library)
        if args.emulated_cuda:
            ops.set_device(args.emulated_cuda)
    elif args.emulated_cuda:
        from src.syncbn.extension import load_emulated_cuda_extension

        ops = load_emulated_cuda_extension(args.emulated_cuda)
    else:
        from src.syncbn.extension import load_extension

        ops = load_extension()
    if args.float64:
        print_float64(ops)
        return 0
    print("| layout | dtype | abs(mean) / std | ours | torch.var_mean (float32) | ours / torch |")
    print("|---|---|---|---|---|---|")
    over = 0
    for layout, dtype, ratio in CASES:
        x = make(layout, dtype, ratio)
        ours, theirs = variance_errors(ops.batch_norm_stats(x), x)
        over += ours > 10 * theirs
        print(f"| {layout} | {str(dtype)[6:]} | {ratio:g} | {ours:.1e} | {theirs:.1e} | {ours / theirs:.2g} |")
    print(f"\n{over} of {len(CASES)} cases over 10x torch.var_mean's error")
    return 0


if __name__ == "__main__":
    sys.exit(main())
