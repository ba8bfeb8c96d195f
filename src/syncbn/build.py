"""Ahead-of-time build of the SyncBN extension: `python -m src.syncbn.build [--cuda] [--cpu-capability ...]`.

Builds into the same cache directory, under the same names, that `load_extension()` looks for, so a
Docker image (or a login node before a batch job) compiles once and every later process imports the
library without a compiler. With `--cuda` the CUDA sources are compiled too, also on a machine without
a GPU (TORCH_CUDA_ARCH_LIST, default "9.0" there); that library is then not imported unless this
machine can use it.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from src.syncbn import extension


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(prog="python -m src.syncbn.build", description=__doc__.split("\n")[0])
    p.add_argument("--cuda", action="store_true",
                   help="also build the CUDA variant (needs nvcc; no GPU needed). Arch list: "
                        f"TORCH_CUDA_ARCH_LIST, else the visible GPUs, else {extension.DEFAULT_CUDA_ARCH_LIST!r}")
    p.add_argument("--cpu-capability", default=None,
                   help="CPU variant(s) to build: one of %s, comma-separated, or 'all' "
                        "(default: this machine's, %s). Build 'all' for an image that runs on "
                        "unknown x86 CPUs." % (", ".join(extension.CPU_CAPABILITIES),
                                              extension.default_cpu_capability()))
    p.add_argument("--verbose", action="store_true", help="show the compiler commands and output")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Build the requested variants; print where they are; exit non-zero on failure."""
    args = parse_args(argv)
    if args.cpu_capability in (None, ""):
        caps = [extension.default_cpu_capability()]
    elif args.cpu_capability == "all":
        caps = list(extension.CPU_CAPABILITIES)
    else:
        caps = [c.strip() for c in args.cpu_capability.split(",") if c.strip()]
    variants = [False, True] if args.cuda else [False]
    native = extension.default_cpu_capability()
    print(f"cache: {extension.extensions_dir()}")
    for with_cuda in variants:
        for cap in caps:
            spec = extension.make_spec(with_cuda=with_cuda, cpu_capability=cap)
            # Import only what this machine can run: its own ISA, and CUDA only with a GPU.
            can_import = cap == native and (not with_cuda or torch.cuda.is_available())
            t0 = time.monotonic()
            try:
                extension.build(spec, import_module=can_import, verbose=args.verbose)
            except (extension.ExtensionBuildError, TimeoutError) as exc:
                print(f"FAILED {spec.name}:\n{exc}", file=sys.stderr)
                return 1
            info = extension.last_build_info()
            what = "built" if info.get("compiled") else "up to date"
            extra = f", TORCH_CUDA_ARCH_LIST={spec.cuda_arch_list}" if with_cuda else ""
            print(f"{what}: {spec.build_dir} ({time.monotonic() - t0:.1f} s{extra}"
                  f"{', imported OK' if can_import else ', not imported on this machine'})")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
