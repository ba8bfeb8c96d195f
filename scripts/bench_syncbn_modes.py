"""Step time and final mIoU of SyncBN's exact mode against its communication-saving modes, on one recipe.

    python scripts/bench_syncbn_modes.py [--nproc 2] [--epochs 16] [--out outputs/syncbn_modes] [-- OVERRIDES]

Runs `torchrun --standalone --nproc_per_node=N train.py experiment=shapes_seg_deeplabv3plus` four times:
the default (every forward synchronised over all ranks), `norm.group_size=G` (default: N/2, the only
proper group size with 2 processes being 1 = per-rank statistics), `norm.sync_every=4`, and
`norm.sync_until_step=S` with S = half the run's optimizer steps. Every run logs each optimizer step
(`trainer.log_every=1`); the step time is the median of the intervals between consecutive train rows of
metrics.jsonl (intervals that contain an evaluation or an epoch's end are left out), the mIoU is the last
validation row's. Prints a Markdown table and one JSON line. Extra overrides after `--` apply to all
four runs (e.g. `-- data.train_size=400` for a short check).
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

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
RECIPE = "experiment=shapes_seg_deeplabv3plus"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"}}
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def read_rows(run_dir: Path) -> list[dict]:
    """metrics.jsonl of a run, in order."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def step_seconds(rows: list[dict]) -> list[float]:
    """Seconds between consecutive per-step train rows, without the intervals that contain other work."""
    out, previous = [], None
    for row in rows:
        if row["split"] != "train":
            previous = None  # an evaluation (and the epoch's checkpoint) happened in between
            continue
        if previous is not None and row["step"] == previous["step"] + 1 and row["epoch"] == previous["epoch"]:
            out.append(row["time"] - previous["time"])
        previous = row
    return out


def run_one(label: str, overrides: list[str], args: argparse.Namespace) -> dict:
    """One torchrun job; returns its label, overrides, median step time, final mIoU and wall time."""
    run_dir = Path(args.out) / label.replace("=", "_")  # Hydra's override grammar rejects '=' in a value
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
            "train.py", RECIPE, f"trainer.epochs={args.epochs}", "trainer.log_every=1", "trainer.progress_bar=false",
            "trainer.tensorboard=false", "device=cpu", *args.overrides, *overrides, f"hydra.run.dir={run_dir}",
            "trainer.overwrite=true"]  # measuring again into the same --out: the earlier run goes to previous/
    started = time.monotonic()
    with open(run_dir.with_suffix(".log"), "w") as log:
        subprocess.run(argv, cwd=REPO, env=_env(), check=True, stdout=log, stderr=subprocess.STDOUT)
    rows = read_rows(run_dir)
    steps = step_seconds(rows)
    val = [r for r in rows if r["split"] == "val"]
    return {"label": label, "overrides": overrides, "median_step_s": statistics.median(steps), "steps": len(steps),
            "final_miou": val[-1]["miou"] if val else float("nan"), "wall_s": time.monotonic() - started,
            "total_steps": max(r["step"] for r in rows)}


def total_steps(args: argparse.Namespace) -> int:
    """Optimizer steps of the whole run, from the composed config (for sync_until_step = half of them)."""
    from hydra import compose, initialize_config_dir

    from src.config import register_train_schema

    register_train_schema()  # conf/train.yaml starts from it

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose("train", overrides=[RECIPE, f"trainer.epochs={args.epochs}", *args.overrides])
    micro_batches = cfg.data.train_size // (args.nproc * cfg.data.batch_size)  # the trainer drops the last
    steps = -(-micro_batches // cfg.trainer.grad_accum_steps) * cfg.trainer.epochs
    return min(steps, cfg.trainer.max_steps) if cfg.trainer.max_steps else steps


def main(argv: list[str] | None = None) -> int:
    """Run the four configurations and print the table."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--epochs", type=int, default=16)
    p.add_argument("--group-size", type=int, default=None, help="default: nproc // 2 (1 with 2 processes)")
    p.add_argument("--out", default="outputs/syncbn_modes")
    args = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    args.overrides = extra
    Path(args.out).mkdir(parents=True, exist_ok=True)
    group = args.group_size or max(args.nproc // 2, 1)
    half = max(total_steps(args) // 2, 1)
    configs = [("default", []), (f"group_size={group}", [f"norm.group_size={group}"]),
               ("sync_every=4", ["norm.sync_every=4"]), (f"sync_until_step={half}", [f"norm.sync_until_step={half}"])]
    results = [run_one(label, overrides, args) for label, overrides in configs]
    base = results[0]["median_step_s"]
    print(f"\n{args.nproc} processes, {RECIPE}, trainer.epochs={args.epochs} {' '.join(extra)}\n")
    print("| norm | median step time (s) | vs default | final val mIoU | steps timed |")
    print("|---|---|---|---|---|")
    for r in results:
        print(f"| {r['label']} | {r['median_step_s']:.3f} | {r['median_step_s'] / base:.2f}x | {r['final_miou']:.3f} "
              f"| {r['steps']} |")
    print(json.dumps({"nproc": args.nproc, "epochs": args.epochs, "overrides": extra, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
