"""What SyncBN's synchronisation costs per training step, against per-process BN and the collectives' floor.

    python scripts/bench_sync_cost.py [--nproc 2] [--jobs cls seg] [--rounds 3] [--steps 2] [--out FILE]

Launches itself under torchrun (gloo, CPU) and, in one run, for each job (`cls`: make train's job,
ResNet-20, 64 images per process at 32 px; `seg`: experiment=shapes_seg_deeplabv3plus, 32 images per
process at 64 px, bf16 autocast) builds the model three times from the same seed, each in DDP with the
trainer's bucket settings:
  bn          per-process nn.BatchNorm2d
  syncbn      our SyncBatchNorm on WORLD, the group DDP's gradient buckets use
  syncbn_own  our SyncBatchNorm on a group of its own (src.syncbn.create_stats_group)
and times full steps (forward, loss, backward, SGD step) in interleaved rounds (bn, syncbn, syncbn_own,
then syncbn, syncbn_own, bn, ...: the order rotates per round; a barrier before each block) so that the
machine's drifting load hits all three alike. Step time = median over rounds and steps of the slowest
rank's step.

Breakdown of a SyncBN step (benchmark-only instrumentation: the two functions of src.syncbn.collectives
are wrapped with timers while this script runs): per step, time inside the collectives, of which
- imbalance: waiting for the peer that arrived later at the same collective (arrival times compared
  across ranks on the machine's monotonic clock),
- floor: the same collectives (same kinds, sizes and count, in order) replayed alone afterwards,
- the rest: queueing behind DDP's bucket all-reduces in the same group, and contention;
and "outside the collectives" = syncbn step - bn step - time inside, i.e. our kernels and Python/packing
against torch's BatchNorm. Prints a Markdown table and one JSON line (also written to --out). With
--nproc 1 there are no collectives: the syncbn - bn difference is then our kernels and Python alone.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

JOBS = {
    "cls": (["model=resnet20", "data=shapes"], 64, 32, False),
    "seg": (["experiment=shapes_seg_deeplabv3plus"], 32, 64, True),
}
CONFIGS = ("bn", "syncbn", "syncbn_own")


class CollectiveTimer:
    """Wraps src.syncbn.collectives' three functions: per call its kind, size, arrival and return time."""

    def __init__(self) -> None:
        from src.syncbn import collectives

        self.module = collectives
        self.originals = {"all_gather": collectives.all_gather_stats, "all_reduce_stats": collectives.all_reduce_stats,
                          "all_reduce": collectives.all_reduce_grads}
        self.calls: list[tuple[str, int, float, float]] = []
        collectives.all_gather_stats = self._wrap("all_gather", self.originals["all_gather"])
        collectives.all_reduce_stats = self._wrap("all_reduce_stats", self.originals["all_reduce_stats"])
        collectives.all_reduce_grads = self._wrap("all_reduce", self.originals["all_reduce"])

    def _wrap(self, kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(tensor: Any, *args: Any) -> Any:
            start = time.perf_counter()
            out = fn(tensor, *args)
            self.calls.append((kind, tensor.numel(), start, time.perf_counter()))
            return out
        return timed

    def take(self) -> list[tuple[str, int, float, float]]:
        """The calls since the last take."""
        calls, self.calls = self.calls, []
        return calls


def build(job: str, config: str, stats_group: Any) -> tuple[Any, Any, Any, Callable[[], Any]]:
    """(DDP model, optimizer, loss function, batch maker) for one job and norm configuration."""
    import dataclasses

    import torch
    from hydra import compose, initialize_config_dir

    from src.config import register_train_schema, validate_config
    from src.engine.wrap import wrap_model
    from src.models.build import build_model

    overrides, batch, size, _ = JOBS[job]
    norm = "bn" if config == "bn" else "syncbn"
    register_train_schema()  # conf/train.yaml starts from it
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = validate_config(compose("train", overrides=[*overrides, f"norm={norm}"]))
    num_classes = cfg.data.num_classes or (6 if job == "cls" else 5)
    torch.manual_seed(0)
    model = build_model(cfg.model, cfg.norm, num_classes)
    if config != "bn":  # explicit groups: WORLD (shared with DDP's buckets) against a group of their own
        import torch.distributed as dist

        for m in model.modules():
            if type(m).__module__.startswith("src.syncbn"):
                m.process_group = stats_group if config == "syncbn_own" else dist.group.WORLD
    # as training wraps it (wrap_model: DDP's buffer-sync argument differs between PyTorch 2.11 and 2.13+)
    model = wrap_model(model, dataclasses.replace(cfg.trainer, broadcast_buffers=False), torch.device("cpu"))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    loss_fn = cfg.resolved_task.loss(cfg.resolved_task.options(cfg))
    gen = torch.Generator().manual_seed(1 + int(os.environ["RANK"]))
    x = torch.randn(batch, 3, size, size, generator=gen)
    y = torch.randint(0, num_classes, (batch,) if job == "cls" else (batch, size, size), generator=gen)
    return model, optimizer, loss_fn, lambda: (x, y)


def step(model: Any, optimizer: Any, loss_fn: Any, batch: Callable[[], Any], bf16: bool) -> None:
    """One training step as the trainer does it (autocast only for the forward and loss)."""
    import torch

    x, y = batch()
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()


def replay(calls: list[tuple[str, int, float, float]], group: Any, repeats: int) -> float:
    """Seconds for the recorded collectives (same kinds, sizes, order) issued alone: median over repeats."""
    import torch
    import torch.distributed as dist

    from src.syncbn import collectives

    name, size = group.group_name, dist.get_world_size(group)
    tensors = [(kind, torch.zeros(numel, dtype=torch.float32 if kind == "all_reduce" else torch.float64))
               for kind, numel, _, _ in calls]
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        for kind, t in tensors:
            if kind == "all_gather":
                collectives.all_gather_stats(t, name, size)
            elif kind == "all_reduce_stats":
                collectives.all_reduce_stats(t, name)
            else:
                collectives.all_reduce_grads(t, name)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def worker(args: argparse.Namespace) -> None:
    """One rank: interleaved timed rounds, the breakdown, the floor; rank 0 prints and writes the result."""
    import torch
    import torch.distributed as dist

    from src.syncbn import create_stats_group

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    stats_group = create_stats_group()
    timer = CollectiveTimer()
    results = {}
    for job in args.jobs:
        bf16 = JOBS[job][3]
        setups = {c: build(job, c, stats_group) for c in CONFIGS}
        for c in CONFIGS:  # warm-up: first-call allocations, kernel loading
            step(*setups[c], bf16)
        timer.take()
        times: dict[str, list[float]] = {c: [] for c in CONFIGS}
        inside: dict[str, list[dict]] = {c: [] for c in CONFIGS}
        last_calls: dict[str, list] = {}
        for r in range(args.rounds):
            # The order rotates per round, so no configuration always runs right after the same other one.
            for c in CONFIGS[r % len(CONFIGS):] + CONFIGS[:r % len(CONFIGS)]:
                for _ in range(args.steps):
                    dist.barrier()
                    start = time.perf_counter()
                    step(*setups[c], bf16)
                    elapsed = time.perf_counter() - start
                    calls = timer.take()
                    times[c].append(elapsed)
                    if calls:
                        inside[c].append(breakdown(calls, rank, world))
                        last_calls[c] = calls
        slowest = {c: _slowest(times[c]) for c in CONFIGS}
        floors = {c: replay(last_calls[c], stats_group if c == "syncbn_own" else dist.group.WORLD, args.rounds * 2)
                  for c in last_calls}
        timer.take()
        results[job] = summarise(slowest, inside, floors, last_calls)
        del setups
    if rank == 0:
        report(results, args)
    dist.destroy_process_group()


def breakdown(calls: list[tuple[str, int, float, float]], rank: int, world: int) -> dict[str, float]:
    """This step's time inside collectives, forward/backward, and the part spent waiting for a later peer."""
    import torch.distributed as dist

    arrivals: list[Any] = [None] * world
    dist.all_gather_object(arrivals, [c[2] for c in calls])
    wait = sum(max(0.0, max(a[i] for a in arrivals) - calls[i][2]) for i in range(len(calls)))
    inside_fwd = sum(c[3] - c[2] for c in calls if c[0] in ("all_gather", "all_reduce_stats"))
    inside_bwd = sum(c[3] - c[2] for c in calls if c[0] == "all_reduce")
    return {"inside": inside_fwd + inside_bwd, "inside_fwd": inside_fwd, "inside_bwd": inside_bwd,
            "imbalance": min(wait, inside_fwd + inside_bwd), "calls": len(calls)}


def _slowest(local: list[float]) -> list[float]:
    """Per step, the slowest rank's time (a step is over when every rank is done)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(local, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def summarise(slowest: dict, inside: dict, floors: dict, calls: dict) -> dict:
    """Medians per configuration and the overhead split for this rank (rank 0's view)."""
    out: dict[str, Any] = {"step_s": {c: statistics.median(v) for c, v in slowest.items()},
                           "steps_timed": {c: len(v) for c, v in slowest.items()}}
    bn = out["step_s"]["bn"]
    for c, rows in inside.items():
        if not rows:  # bn: no SyncBN collectives
            continue
        med = {k: statistics.median(r[k] for r in rows) for k in ("inside", "inside_fwd", "inside_bwd", "imbalance")}
        med["floor"] = floors[c]
        med["calls"] = len(calls[c])
        med["bytes"] = sum(n * (4 if k == "all_reduce" else 8) for k, n, _, _ in calls[c])
        med["rest_in_collectives"] = med["inside"] - med["imbalance"] - med["floor"]
        med["outside_collectives"] = out["step_s"][c] - bn - med["inside"]
        out[c] = med
    return out


def report(results: dict, args: argparse.Namespace) -> None:
    """Markdown tables and one JSON line."""
    print(f"\n{args.nproc} processes, {args.rounds} rounds x {args.steps} steps per configuration\n")
    print("| job | bn s/step | syncbn s/step | syncbn_own s/step | syncbn/bn | syncbn_own/bn | floor s/step | "
          "calls/step |")
    print("|---|---|---|---|---|---|---|---|")
    for job, r in results.items():
        s = r["step_s"]
        sync = r.get("syncbn", {"floor": 0.0, "calls": 0})  # --nproc 1: no collectives, no breakdown
        print(f"| {job} | {s['bn']:.3f} | {s['syncbn']:.3f} | {s['syncbn_own']:.3f} | {s['syncbn'] / s['bn']:.3f} | "
              f"{s['syncbn_own'] / s['bn']:.3f} | {sync['floor']:.4f} | {sync['calls']} |")
    print("\n| job | config | overhead vs bn (s) | inside collectives (fwd / bwd) | imbalance wait | floor | "
          "rest in collectives | outside collectives |")
    print("|---|---|---|---|---|---|---|---|")
    for job, r in results.items():
        for c in ("syncbn", "syncbn_own"):
            if c not in r:  # one process: the whole overhead is outside collectives
                print(f"| {job} | {c} | {r['step_s'][c] - r['step_s']['bn']:.4f} | 0 (one process) | 0 | 0 | 0 | "
                      f"{r['step_s'][c] - r['step_s']['bn']:.4f} |")
                continue
            b = r[c]
            print(f"| {job} | {c} | {r['step_s'][c] - r['step_s']['bn']:.4f} | {b['inside']:.4f} "
                  f"({b['inside_fwd']:.4f} / {b['inside_bwd']:.4f}) | {b['imbalance']:.4f} | {b['floor']:.4f} | "
                  f"{b['rest_in_collectives']:.4f} | {b['outside_collectives']:.4f} |")
    line = json.dumps({"nproc": args.nproc, "rounds": args.rounds, "steps": args.steps, "results": results})
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")


def main(argv: list[str] | None = None) -> int:
    """Parse; under torchrun run a rank, otherwise launch torchrun on this script."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--jobs", nargs="+", choices=sorted(JOBS), default=["cls", "seg"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=2, help="consecutive steps per configuration per round")
    p.add_argument("--out", default="", help="also write the JSON line here")
    args = p.parse_args(argv)
    if "RANK" in os.environ:
        worker(args)
        return 0
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    # The ranks get their world size from torchrun; `--nproc` itself is not passed on, because torchrun's
    # parser takes it for an abbreviation of its own --nproc-per-node even after the script's path.
    rank_args = ["--jobs", *args.jobs, "--rounds", str(args.rounds), "--steps", str(args.steps)]
    if args.out:
        rank_args += ["--out", args.out]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
           __file__, *rank_args]
    return subprocess.run(cmd, cwd=REPO, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
