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

    python scripts/bench_compile.py --paired [--world 1] [--norms syncbn,bn] [--rounds 30] [--channels-last]
                                    [--fuse forward,backward|forward|backward|none]

measures instead the default job's model (ResNet-20, batch 64 of 3x32x32 per process, fused SGD, 1
thread per process) eager and compiled side by side in the same processes: the two copies take turns,
two training steps each, and the per-round ratio compiled/eager is reported as a median with quartiles
(2 processes under torchrun by default: each copy in DistributedDataParallel, the compiled one compiled
after wrapping as trainer.compile does, the ranks starting each turn together). Pairing the turns
cancels the load drift of a shared machine that makes separate runs disagree by +-40%. `--fuse` chooses
which of SyncBN's elementwise passes take the form Inductor can fuse (src/syncbn/fusable.py; `none`
keeps our opaque kernels under compile too), to measure what each pass gains.

    python scripts/bench_compile.py --eager-overhead [--shapes 2x8x4x4,8x16x8x8,32x64x16x16]

times what making the kernels traceable costs eager mode: SyncBatchNorm2d forward+backward (one process,
1 thread) with its five kernels called through the PyTorch dispatcher (torch.ops.<variant>.*, what the
layer uses) and, in turns with it, called directly as the extension's Python-bound functions (what it
used before); the same C++ kernels either way, so the difference is the dispatcher's call overhead.
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
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
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


def paired(norm: str, rounds: int, mode: str, channels_last: bool = False) -> dict[str, float]:
    """Eager and compiled copies of the default job's model stepped in turns in this process; ms/step, ratio."""
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from src import comm
    from src.models import build_model
    from src.models.config import ModelConfig, NormConfig

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(comm.get_rank())
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(64, 3, 32, 32, generator=gen).contiguous(memory_format=fmt)
    y = torch.randint(0, 6, (64,), generator=gen)
    steps, first = {}, {}
    for name in ("eager", "compiled"):
        torch.manual_seed(0)
        model = build_model(ModelConfig(name="resnet20"), NormConfig(name=norm), 6).to(memory_format=fmt)
        opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9, nesterov=True, fused=True)  # as the trainer
        forward = DistributedDataParallel(model) if comm.get_world_size() > 1 else model
        if name == "compiled":
            forward = torch.compile(forward, mode=None if mode == "default" else mode)

        def step(forward=forward, opt=opt) -> None:
            loss = F.cross_entropy(forward(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        t0 = time.perf_counter()
        step()
        first[name] = time.perf_counter() - t0
        step()
        steps[name] = step
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    for r in range(rounds):
        for name in (("eager", "compiled") if r % 2 else ("compiled", "eager")):
            comm.barrier()
            t0 = time.perf_counter()
            steps[name]()
            steps[name]()
            times[name].append((time.perf_counter() - t0) / 2)
    ratios = [c / e for c, e in zip(times["compiled"], times["eager"])]
    quartiles = statistics.quantiles(ratios, n=4)
    return {"norm": norm, "channels_last": channels_last, "eager_ms": 1e3 * statistics.median(times["eager"]),
            "compiled_ms": 1e3 * statistics.median(times["compiled"]), "ratio_median": statistics.median(ratios),
            "ratio_q1": quartiles[0], "ratio_q3": quartiles[2], "first_step_s": first["compiled"]}


def eager_overhead(shape: tuple[int, ...], rounds: int) -> dict[str, float]:
    """SyncBatchNorm2d fwd+bwd with dispatcher ops vs the Python-bound functions, in turns; microseconds."""
    from types import SimpleNamespace

    import torch

    from src.syncbn import SyncBatchNorm2d, functions
    from src.syncbn.extension import load_extension
    from src.syncbn.fake_kernels import OP_NAMES

    torch.set_num_threads(1)
    module = load_extension()
    dispatcher = functions.kernel_ops()
    direct = functions.KernelOps.from_module(SimpleNamespace(**{n: getattr(module, n) for n in OP_NAMES}))
    layer = SyncBatchNorm2d(shape[1])
    x, dy = torch.randn(shape, requires_grad=True), torch.randn(shape)
    n = max(5, int(2e7 // x.numel()) // 10)  # calls per turn: ~tens of ms per turn at any size
    times: dict[str, list[float]] = {"dispatcher": [], "direct": []}
    try:
        for r in range(rounds):
            for name, ops in ((("dispatcher", dispatcher), ("direct", direct)) if r % 2 else
                              (("direct", direct), ("dispatcher", dispatcher))):
                functions._OPS = ops
                t0 = time.perf_counter()
                for _ in range(n):
                    layer(x).backward(dy)
                times[name].append((time.perf_counter() - t0) / n)
    finally:
        functions._OPS = dispatcher
    d, p = statistics.median(times["dispatcher"]), statistics.median(times["direct"])
    return {"shape": "x".join(map(str, shape)), "dispatcher_us": 1e6 * d, "direct_us": 1e6 * p,
            "added_us": 1e6 * (d - p), "ratio": d / p}


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
    parser.add_argument("--paired", action="store_true", help="in-process paired timing instead (see above)")
    parser.add_argument("--norms", default="syncbn,bn", help="with --paired: norm settings to time")
    parser.add_argument("--rounds", type=int, default=30, help="with --paired: turns per variant")
    parser.add_argument("--channels-last", action="store_true", help="with --paired: model and input channels_last")
    parser.add_argument("--fuse", choices=("forward,backward", "forward", "backward", "none"), default=None,
                        help="which SyncBN elementwise passes take the fusable aten form under compile "
                             "(sets SYNCTRAIN_SYNCBN_FUSE for every process; default: the environment's, else both)")
    parser.add_argument("--paired-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    parser.add_argument("--eager-overhead", action="store_true", help="dispatcher cost in eager mode (see above)")
    parser.add_argument("--shapes", default="2x8x4x4,8x16x8x8,32x64x16x16,64x64x32x32",
                        help="with --eager-overhead: NxCxHxW, comma-separated")
    parser.add_argument("overrides", nargs="*", help="more train.py overrides, for both variants")
    args = parser.parse_args()
    if args.fuse is not None:
        # src.syncbn.fusable reads it once at import; nothing of src is imported yet, and children inherit it.
        os.environ["SYNCTRAIN_SYNCBN_FUSE"] = args.fuse
    if args.eager_overhead:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
        results = [eager_overhead(shape, args.rounds) for shape in shapes]
        for r in results:
            print(f"{r['shape']}: dispatcher {r['dispatcher_us']:.1f} us, direct {r['direct_us']:.1f} us, "
                  f"added {r['added_us']:+.1f} us ({r['ratio']:.3f})", flush=True)
        print(json.dumps({"eager_overhead": results, "rounds": args.rounds}))
        return
    if args.paired_worker:  # one rank of --paired --world N, under torchrun
        import torch

        from src import comm, process_group

        process_group.init_distributed(torch.device("cpu"), timeout_s=1800.0, init_timeout_s=300.0)
        results = [paired(norm, args.rounds, args.mode, args.channels_last) for norm in args.norms.split(",")]
        if comm.get_rank() == 0:
            Path(args.out).write_text(json.dumps(results))
        process_group.destroy()
        return
    if args.paired:
        if args.world > 1:
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "paired.json"
                argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                        f"--nproc_per_node={args.world}", str(Path(__file__).resolve()), "--paired-worker",
                        "--out", str(out), f"--norms={args.norms}", f"--rounds={args.rounds}", f"--mode={args.mode}",
                        *(["--channels-last"] if args.channels_last else [])]
                subprocess.run(argv, cwd=REPO, env=_env(None), check=True)
                results = json.loads(out.read_text())
        else:
            results = [paired(norm, args.rounds, args.mode, args.channels_last) for norm in args.norms.split(",")]
        for r in results:
            print(f"norm={r['norm']}{' channels_last' if r['channels_last'] else ''}: eager {r['eager_ms']:.1f} ms/step, compiled {r['compiled_ms']:.1f} ms/step; "
                  f"paired compiled/eager {r['ratio_median']:.3f} (quartiles {r['ratio_q1']:.3f}-{r['ratio_q3']:.3f}); "
                  f"first compiled step {r['first_step_s']:.1f} s", flush=True)
        print(json.dumps({"paired": results, "world": args.world, "rounds": args.rounds, "mode": args.mode}))
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
        return
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
