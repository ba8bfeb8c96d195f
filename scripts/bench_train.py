"""Images/s of our trainer vs a minimal hand-written DDP loop: same model, data, world size, one run.

    python scripts/bench_train.py [--world 2] [--steps 60] [--batch 64] [--norm syncbn] [--repeats 2]

Both sides are launched with torchrun on the same machine, alternately (baseline, trainer, baseline,
trainer, ...) so that drift in a shared machine's load hits both. Both use the same model builder, the
same dataset and the same TrainBatchSampler loader, so the difference is the trainer's own overhead:
logging, progress bar, metric reduction, LR scheduler, norm health checks, tracking. Throughput is
measured between the `--skip`-th and the last optimizer step from wall-clock timestamps (warm-up,
start-up and the final evaluation excluded on both sides), and rank 0's CPU time per image over the
same steps (robust to other jobs sharing the machine, which swing wall-clock rates by +-40%). Prints a
summary and one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _torchrun(nproc: int, argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *argv]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"}}
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_trainer(args: argparse.Namespace, run_dir: Path) -> dict[str, float]:
    """Our train.py for --steps optimizer steps; img/s from metrics.jsonl timestamps (a row every --skip steps)."""
    overrides = [
        f"norm={args.norm}", f"model={args.model}", "data=shapes", f"data.batch_size={args.batch}",
        f"data.train_size={args.train_size}", "data.val_size=100", "device=cpu", f"trainer.log_every={args.skip}",
        f"trainer.max_steps={args.steps}", "trainer.epochs=1000", "trainer.tensorboard=true",
        f"hydra.run.dir={run_dir}",
    ]
    subprocess.run(_torchrun(args.world, ["train.py", *overrides]), cwd=REPO, env=_env(), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if r["split"] == "train"}
    return _rates(args, rows[args.skip]["time"], rows[args.steps]["time"], rows[args.skip]["cpu_s"],
                  rows[args.steps]["cpu_s"])


def _rates(args: argparse.Namespace, t0: float, t1: float, cpu0: float, cpu1: float) -> dict[str, float]:
    """Global images/s (wall clock) and rank 0's CPU milliseconds per image it processed."""
    steps = args.steps - args.skip
    return {"images_per_s": steps * args.world * args.batch / (t1 - t0),
            "cpu_ms_per_image": 1000.0 * (cpu1 - cpu0) / (steps * args.batch)}


def run_baseline(args: argparse.Namespace, out: Path) -> dict[str, float]:
    """The hand-written loop below under torchrun; img/s over the same steps."""
    argv = [str(Path(__file__).resolve()), "--worker", "--out", str(out), *sys.argv[1:]]
    subprocess.run(_torchrun(args.world, argv), cwd=REPO, env=_env(), check=True)
    return json.loads(out.read_text())


def baseline_worker(args: argparse.Namespace) -> None:
    """Minimal DDP loop: forward, cross-entropy, backward, SGD step. Nothing else."""
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from src import comm, process_group
    from src.config import TrainerConfig, data_config
    from src.data import build_datasets, build_train_loader
    from src.models import build_model
    from src.tasks import get_task
    from src.models.config import ModelConfig, NormConfig

    device = torch.device("cpu")
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // comm.get_local_world_size()))
    trainer = TrainerConfig()  # the trainer's own timeouts
    process_group.init_distributed(device, timeout_s=trainer.dist_timeout_s, init_timeout_s=trainer.dist_init_timeout_s)
    rank, world = comm.get_rank(), comm.get_world_size()
    data_cfg = data_config(name="shapes", batch_size=args.batch, train_size=args.train_size, val_size=100,
                           num_classes=8)
    data = build_datasets(data_cfg, get_task("classification").data, seed=0)
    loader = build_train_loader(data.train, data_cfg, rank, world, seed=0)
    torch.manual_seed(0)
    model = build_model(ModelConfig(name=args.model), NormConfig(name=args.norm), data.num_classes)
    ddp = DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9, nesterov=True, weight_decay=5e-4,
                          fused=True)  # as the trainer (optim=sgd)
    step, stamps, cpu = 0, {}, {}
    while step < args.steps:
        loader.batch_sampler.set_epoch(step)
        for images, targets, _ in loader:
            loss = F.cross_entropy(ddp(images), targets)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if step in (args.skip, args.steps):
                loss.item()  # same host sync the trainer's logging forces
                stamps[step], cpu[step] = time.time(), time.process_time()
            if step == args.steps:
                break
    if rank == 0:
        rates = _rates(args, stamps[args.skip], stamps[args.steps], cpu[args.skip], cpu[args.steps])
        Path(args.out).write_text(json.dumps(rates))
    process_group.destroy()


def main() -> None:
    """Parse arguments; run alternately and report the overhead."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=2, help="processes (torchrun --nproc_per_node)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--skip", type=int, default=10, help="warm-up steps left out of the measurement")
    parser.add_argument("--batch", type=int, default=64, help="per-process batch")
    parser.add_argument("--train-size", type=int, default=10000)
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--norm", default="syncbn")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args()
    if args.steps % args.skip or args.steps <= args.skip:
        parser.error("--steps must be a multiple of --skip and larger than it (train rows come every --skip steps)")
    if args.worker:
        baseline_worker(args)
        return
    ours, base = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            base.append(run_baseline(args, Path(tmp) / f"base{i}.json"))
            ours.append(run_trainer(args, Path(tmp) / f"run{i}"))
            print(f"round {i}: baseline {base[-1]['images_per_s']:.1f} img/s {base[-1]['cpu_ms_per_image']:.2f} "
                  f"CPU-ms/img | trainer {ours[-1]['images_per_s']:.1f} img/s "
                  f"{ours[-1]['cpu_ms_per_image']:.2f} CPU-ms/img", flush=True)
    summary = {}
    for key in ("images_per_s", "cpu_ms_per_image"):
        b, o = statistics.median(r[key] for r in base), statistics.median(r[key] for r in ours)
        # Overhead: how much slower (wall) or costlier (CPU) our trainer is than the hand-written loop.
        summary[key] = {"baseline": b, "trainer": o,
                        "overhead_percent": 100.0 * ((b - o) / b if key == "images_per_s" else (o - b) / b)}
    print(f"{args.model} norm={args.norm}, {args.world} process(es) x batch {args.batch}, steps {args.skip}..{args.steps}:")
    print(f"  wall clock: hand-written DDP {summary['images_per_s']['baseline']:.1f} img/s, trainer "
          f"{summary['images_per_s']['trainer']:.1f} img/s, overhead {summary['images_per_s']['overhead_percent']:+.1f}%")
    print(f"  CPU (rank 0): hand-written DDP {summary['cpu_ms_per_image']['baseline']:.2f} ms/img, trainer "
          f"{summary['cpu_ms_per_image']['trainer']:.2f} ms/img, overhead "
          f"{summary['cpu_ms_per_image']['overhead_percent']:+.1f}%")
    print(json.dumps({**summary, "baseline_runs": base, "trainer_runs": ours, "world_size": args.world,
                      "batch": args.batch, "model": args.model, "norm": args.norm}))

if __name__ == "__main__":
    main()
