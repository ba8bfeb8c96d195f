"""Images/s of `make train`'s job eager vs trainer.compile=true, and the compile time, in one run.

    python scripts/bench_compile.py [--world 2] [--steps 60] [--skip 10] [--repeats 2] [--mode default]
                                    [--json out.json] [train.py overrides ...]

Both variants are the default job (ResNet-20, norm=syncbn, shapes, batch 64 per process) launched with
torchrun on this machine, alternately (eager, compiled, eager, compiled, ...), so drift in a shared
machine's load hits both. Throughput is measured between the `--skip`-th and the last optimizer step from
metrics.jsonl timestamps (start-up, compilation, warm-up and the final evaluation excluded), together with
rank 0's CPU time per image over the same steps. Compile time is what the compiled run's first step took
(trainer.compile logs it: Dynamo tracing plus Inductor's code generation and C++ builds for the forward
and the backward), with the eager run's median step time for comparison; the first evaluation compiles
the eval-mode graph too, which shows in the whole-run wall time (also reported). Inductor's on-disk cache
(TORCHINDUCTOR_CACHE_DIR) is pointed at a fresh directory per compiled run unless --warm-cache, so every
compiled run pays the cold compile a new machine pays. Prints a summary and one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIRST_STEP = re.compile(r"torch\.compile: first step \(compiling forward and backward\) took ([0-9.]+) s; "
                        r"the training forward is (\d+) graph")


def _env(cache_dir: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"}}
    env.setdefault("OMP_NUM_THREADS", "1")
    if cache_dir is not None:
        env["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    return env


def run(args: argparse.Namespace, run_dir: Path, compiled: bool, cache_dir: str | None) -> dict[str, float]:
    """One train.py run; img/s and CPU ms/img over steps skip..steps, wall time, first-step time."""
    overrides = [
        "device=cpu", f"data.val_size={args.val_size}", f"trainer.log_every={args.skip}",
        f"trainer.max_steps={args.steps}", "trainer.epochs=1000", "trainer.progress_bar=false",
        f"trainer.compile={str(compiled).lower()}", f"trainer.compile_mode={args.mode}",
        f"hydra.run.dir={run_dir}", *args.overrides,
    ]
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.world}",
            "train.py", *overrides]
    t0 = time.time()
    out = subprocess.run(argv, cwd=REPO, env=_env(cache_dir), capture_output=True, text=True)
    wall = time.time() - t0
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    rows = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["split"] == "train"]
    by_step = {r["step"]: r for r in rows}
    first, last = by_step[args.skip], by_step[args.steps]
    steps, batch = args.steps - args.skip, _batch(args)
    result = {"images_per_s": steps * args.world * batch / (last["time"] - first["time"]),
              "cpu_ms_per_image": 1000.0 * (last["cpu_s"] - first["cpu_s"]) / (steps * batch),
              "step_s": (last["time"] - first["time"]) / steps, "wall_s": wall}
    match = FIRST_STEP.search(out.stdout + out.stderr)
    if compiled:
        if match is None:
            raise RuntimeError("the compiled run did not report its first step; is trainer.compile wired in?")
        result["first_step_s"], result["graphs"] = float(match.group(1)), int(match.group(2))
    return result


def _batch(args: argparse.Namespace) -> int:
    for o in args.overrides:
        if o.startswith("data.batch_size="):
            return int(o.split("=", 1)[1])
    return 64  # conf/data/shapes.yaml


def main() -> None:
    """Parse arguments, run eager and compiled alternately, print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=2, help="processes (torchrun --nproc_per_node)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--skip", type=int, default=10, help="steps left out of the measurement (compile, warm-up)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--mode", default="default", help="trainer.compile_mode")
    parser.add_argument("--val-size", type=int, default=500, help="data.val_size (the final evaluation)")
    parser.add_argument("--warm-cache", action="store_true", help="reuse Inductor's default on-disk cache")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("overrides", nargs="*", help="more train.py overrides, for both variants")
    args = parser.parse_args()
    if args.steps % args.skip or args.steps <= args.skip:
        parser.error("--steps must be a multiple of --skip and larger than it (train rows come every --skip steps)")
    eager, compiled = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            eager.append(run(args, Path(tmp) / f"eager{i}", False, None))
            cache = None if args.warm_cache else str(Path(tmp) / f"inductor_cache{i}")
            compiled.append(run(args, Path(tmp) / f"compiled{i}", True, cache))
            print(f"round {i}: eager {eager[-1]['images_per_s']:.1f} img/s, {eager[-1]['wall_s']:.0f} s run | "
                  f"compiled {compiled[-1]['images_per_s']:.1f} img/s, {compiled[-1]['wall_s']:.0f} s run, first "
                  f"step {compiled[-1]['first_step_s']:.1f} s, {compiled[-1]['graphs']} graph(s)", flush=True)
    med = {k: {"eager": statistics.median(r[k] for r in eager), "compiled": statistics.median(r[k] for r in compiled)}
           for k in ("images_per_s", "cpu_ms_per_image", "step_s", "wall_s")}
    first_step = statistics.median(r["first_step_s"] for r in compiled)
    speedup = med["images_per_s"]["compiled"] / med["images_per_s"]["eager"]
    print(f"default job ({' '.join(args.overrides) or 'no overrides'}), {args.world} processes, steps "
          f"{args.skip}..{args.steps}, compile_mode={args.mode}, median of {args.repeats}:")
    print(f"  images/s: eager {med['images_per_s']['eager']:.1f}, compiled {med['images_per_s']['compiled']:.1f} "
          f"(x{speedup:.2f})")
    print(f"  rank-0 CPU ms/image: eager {med['cpu_ms_per_image']['eager']:.2f}, compiled "
          f"{med['cpu_ms_per_image']['compiled']:.2f}")
    print(f"  compile: first compiled step {first_step:.1f} s vs an eager step {med['step_s']['eager']:.2f} s; "
          f"whole run {med['wall_s']['compiled']:.0f} s compiled vs {med['wall_s']['eager']:.0f} s eager")
    result = {"medians": med, "first_step_s": first_step, "speedup": speedup, "eager_runs": eager,
              "compiled_runs": compiled, "world": args.world, "steps": args.steps, "skip": args.skip,
              "mode": args.mode, "overrides": args.overrides, "warm_cache": args.warm_cache}
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
