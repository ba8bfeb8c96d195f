"""Images/s of our trainer vs a minimal hand-written DDP loop: same model, data, world size, one run.

    python scripts/bench_train.py [--world 2] [--steps 60] [--batch 64] [--norm syncbn] [--repeats 2]

Both sides are launched with torchrun on the same machine, alternately (baseline, trainer, baseline,
trainer, ...) so that drift in a shared machine's load hits both. Both use the same model builder, the
same dataset and the same TrainBatchSampler loader, so the difference is the trainer's own overhead:
logging, progress bar, metric reduction, LR scheduler, norm health checks, tracking. Throughput is
measured between the `--skip`-th and the last optimizer step from wall-clock timestamps (warm-up,
start-up and the final evaluation excluded on both sides). Prints a table and one JSON line.
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


def run_trainer(args: argparse.Namespace, run_dir: Path) -> float:
    """Our train.py for --steps optimizer steps; img/s from metrics.jsonl timestamps (a row every --skip steps)."""
    overrides = [
        f"norm={args.norm}", f"model={args.model}", "data=shapes", f"data.batch_size={args.batch}",
        f"data.train_size={args.train_size}", "data.val_size=100", "device=cpu", f"trainer.log_every={args.skip}",
        f"trainer.max_steps={args.steps}", "trainer.epochs=1000", "trainer.tensorboard=true",
        f"hydra.run.dir={run_dir}",
    ]
    subprocess.run(_torchrun(args.world, ["train.py", *overrides]), cwd=REPO, env=_env(), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    times = {r["step"]: r["time"] for r in rows if r["split"] == "train"}
    steps = args.steps - args.skip
    return steps * args.world * args.batch / (times[args.steps] - times[args.skip])


def run_baseline(args: argparse.Namespace, out: Path) -> float:
    """The hand-written loop below under torchrun; img/s over the same steps."""
    argv = [str(Path(__file__).resolve()), "--worker", "--out", str(out), *sys.argv[1:]]
    subprocess.run(_torchrun(args.world, argv), cwd=REPO, env=_env(), check=True)
    return json.loads(out.read_text())["images_per_s"]


def baseline_worker(args: argparse.Namespace) -> None:
    """Minimal DDP loop: forward, cross-entropy, backward, SGD step. Nothing else."""
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from src import dist
    from src.data import build_datasets, build_train_loader
    from src.data.config import DataConfig
    from src.models import build_model
    from src.models.config import ModelConfig, NormConfig

    device = torch.device("cpu")
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // dist.get_local_world_size()))
    dist.init_distributed(device)
    rank, world = dist.get_rank(), dist.get_world_size()
    data_cfg = DataConfig(name="shapes", batch_size=args.batch, train_size=args.train_size, val_size=100,
                          num_classes=8)
    data = build_datasets(data_cfg, seed=0)
    loader = build_train_loader(data.train, data_cfg, rank, world, seed=0)
    torch.manual_seed(0)
    model = build_model(ModelConfig(name=args.model), NormConfig(name=args.norm), data.num_classes)
    ddp = DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    step, stamps = 0, {}
    while step < args.steps:
        loader.batch_sampler.set_epoch(step)
        for images, targets in loader:
            loss = F.cross_entropy(ddp(images), targets)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if step in (args.skip, args.steps):
                loss.item()  # same host sync the trainer's logging forces
                stamps[step] = time.time()
            if step == args.steps:
                break
    if rank == 0:
        ips = (args.steps - args.skip) * world * args.batch / (stamps[args.steps] - stamps[args.skip])
        Path(args.out).write_text(json.dumps({"images_per_s": ips}))
    dist.destroy()


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
            print(f"round {i}: baseline {base[-1]:.1f} img/s, trainer {ours[-1]:.1f} img/s", flush=True)
    b, o = statistics.median(base), statistics.median(ours)
    overhead = 100.0 * (b - o) / b
    print(f"{args.model} norm={args.norm}, {args.world} process(es) x batch {args.batch}, "
          f"steps {args.skip}..{args.steps}: hand-written DDP {b:.1f} img/s, trainer {o:.1f} img/s, "
          f"overhead {overhead:+.1f}%")
    print(json.dumps({"baseline_images_per_s": b, "trainer_images_per_s": o, "overhead_percent": overhead,
                      "baseline_runs": base, "trainer_runs": ours, "world_size": args.world, "batch": args.batch,
                      "model": args.model, "norm": args.norm}))


if __name__ == "__main__":
    main()
