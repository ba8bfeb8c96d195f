"""What synchronising BatchNorm buys at small per-process batches: train from scratch, compare norms.

    python scripts/syncbn_benefit.py [--quick] [--out outputs/syncbn_benefit] [--seeds 0 1]
        [--tasks cls seg] [--worlds 2] [--batch 2] [--steps 120] [--evals 4] [--spread 1.0] [--report-only]

For each task (`cls`: make train's ResNet-20 on `data=shapes`; `seg`: the DeepLabV3+ recipe's model,
experiment=shapes_seg_deeplabv3plus, on `data=shapes_seg`), each world size W, each per-process batch B
(`--worlds` and `--batch` take several values) and each seed it trains from scratch, with torchrun and W
processes of B images each:
  bn      per-process BatchNorm (statistics of `--batch` images)
  syncbn  our SyncBatchNorm (statistics of the W x batch images of the step)
  gn      GroupNorm (no batch statistics at all)
and, as the reference, one process with BatchNorm on the whole global batch (`ref`, W x batch images).
Every run has the same global batch, optimizer steps, learning-rate schedule, samples and augmentation
(the sampler gives the one-process batch split across ranks), so only the normalisation differs.
`data.photometric_spread` (default 1.0) gives every image its own contrast, brightness and colour
offset, so the statistics of 2 images are far from those of a global batch.

Each run evaluates `--evals` times (data.train_size is set so that an epoch is steps / evals optimizer
steps). Writes, under --out: one run folder per run (metrics.jsonl, the log), results.json, table.md
(final validation top-1 / mIoU, mean and spread over seeds per norm and setting) and benefit.png
(validation metric against step, mean over seeds and min-max band, one panel per task and setting).
The plot needs matplotlib (`.venv/bin/pip install matplotlib`); without it the script still writes the
table and says so. A run's folder is named by task, W, B, steps, norm and seed, and a finished run is
skipped, so a stopped experiment resumes where it stopped and several invocations (say, a longer
classification setting and a segmentation one) can share one --out. `--report-only` trains nothing and
writes the table and plot from every run finished under --out, whatever invocation made it. `--quick` is a smoke test: one seed,
W=2, a few steps, tiny validation sets (about 10 minutes on 2 loaded cores, mostly start-up).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NORMS = ("bn", "syncbn", "gn", "ref")
METRIC = {"cls": "top1", "seg": "miou"}
# Per task: the model/data overrides, the validation size and a learning rate for a global batch of a
# few images, used as given (reference_batch_size=null: the recipes' rates are for 128 / 64 images per step and
# would be scaled down). Segmentation runs at 32 px (the recipe's 64 px costs 4x per step) so that the whole
# experiment fits a loaded 2-core machine.
TASKS = {
    "cls": (["data=shapes", "model=resnet20", "optim.lr=0.02", "optim.reference_batch_size=null",
             "optim.nesterov=false", "sched.warmup_epochs=0"], 300),
    "seg": (["experiment=shapes_seg_deeplabv3plus", "optim.lr=1.0e-3", "optim.reference_batch_size=null",
             "sched.warmup_epochs=0",
             "model.aux_loss_weight=0", "data.eval_batch_size=50", "data.image_size=32", "data.crop_size=32",
             "data.base_size=32"], 100),
}


@dataclass
class Run:
    """One training run of the experiment."""

    task: str
    world: int
    batch: int
    norm: str
    seed: int
    steps: int
    evals: int
    spread: float
    overrides: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        """Folder name: task, setting, norm, seed."""
        return f"{self.task}_w{self.world}b{self.batch}_n{self.steps}_{self.norm}_s{self.seed}"

    @property
    def nproc(self) -> int:
        """Processes launched: the reference is one process with the global batch."""
        return 1 if self.norm == "ref" else self.world

    def argv(self, run_dir: Path) -> list[str]:
        """The command line of this run."""
        task_overrides, val_size = TASKS[self.task]
        global_batch = self.world * self.batch
        per_eval = max(self.steps // self.evals, 1)
        norm = "bn" if self.norm == "ref" else self.norm
        overrides = [
            *task_overrides, f"norm={norm}", f"data.batch_size={global_batch // self.nproc}",
            f"data.train_size={per_eval * global_batch}", f"data.val_size={val_size}",
            f"data.photometric_spread={self.spread}", f"trainer.epochs={self.evals}", f"seed={self.seed}",
            f"trainer.log_every={max(per_eval // 5, 1)}", "trainer.progress_bar=false",
            "trainer.tensorboard=false", "trainer.num_threads=1", "device=cpu", *self.overrides,
            # a run without done.json is trained again: its unfinished attempt goes to <run dir>/previous/
            f"hydra.run.dir={run_dir}", "trainer.overwrite=true",
        ]
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={self.nproc}",
                "train.py", *overrides]


def plan(args: argparse.Namespace) -> list[Run]:
    """Every run, interleaved by seed so that a stopped experiment still has all norms for its first seeds."""
    return [Run(task, world, batch, norm, seed, args.steps, args.evals, args.spread, args.overrides)
            for seed in args.seeds for task in args.tasks for world in args.worlds for batch in args.batch
            for norm in NORMS]


def finished(out: Path) -> list[dict]:
    """The records of every run finished under `out`, by folder name."""
    return [json.loads(p.read_text()) for p in sorted(out.glob("*/done.json"))]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"}}
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def val_curve(rows: list[dict], metric: str) -> list[tuple[int, float]]:
    """(step, metric) of every validation row, in order."""
    return [(r["step"], float(r[metric])) for r in rows if r.get("split") == "val" and metric in r]


def execute(run: Run, out: Path) -> dict:
    """Train one run (skipped when its results are already there) and return its record."""
    run_dir = out / run.name
    metrics = run_dir / "metrics.jsonl"
    done = run_dir / "done.json"
    if done.exists():
        return json.loads(done.read_text())
    started = time.monotonic()
    with open(out / f"{run.name}.log", "w") as log:
        proc = subprocess.run(run.argv(run_dir), cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT)
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()] if metrics.exists() else []
    record = {**asdict(run), "name": run.name, "returncode": proc.returncode, "wall_s": time.monotonic() - started,
              "curve": val_curve(rows, METRIC[run.task])}
    if proc.returncode == 0:
        done.write_text(json.dumps(record))
    return record


def summarise(records: list[dict]) -> list[dict]:
    """Per task, setting (W, B, steps) and norm: final metric's mean, population std, min and max over seeds."""
    groups: dict[tuple, list[float]] = {}
    for r in records:
        if r["returncode"] == 0 and r["curve"]:
            key = (r["task"], r["world"], r["batch"], r["steps"], r["norm"])
            groups.setdefault(key, []).append(r["curve"][-1][1])
    out = []
    for (task, world, batch, steps, norm), finals in sorted(groups.items(),
                                                             key=lambda kv: (kv[0][:4], NORMS.index(kv[0][4]))):
        out.append({"task": task, "world": world, "batch": batch, "steps": steps, "norm": norm, "metric": METRIC[task],
                    "n": len(finals), "mean": statistics.fmean(finals), "std": statistics.pstdev(finals),
                    "min": min(finals), "max": max(finals), "finals": finals})
    return out


def markdown_table(summary: list[dict]) -> str:
    """The table for docs/why-syncbn.md."""
    lines = ["| task | processes x images | steps | norm | final val metric: mean ± std (min-max) | seeds |",
             "|---|---|---|---|---|---|"]
    for s in summary:
        setting = f"1 x {s['world'] * s['batch']}" if s["norm"] == "ref" else f"{s['world']} x {s['batch']}"
        label = "bn, one process (reference)" if s["norm"] == "ref" else s["norm"]
        lines.append(f"| {s['task']} ({s['metric']}) | {setting} | {s['steps']} | {label} | {s['mean']:.3f} ± {s['std']:.3f} "
                     f"({s['min']:.3f}-{s['max']:.3f}) | {s['n']} |")
    return "\n".join(lines)


def plot(records: list[dict], path: Path) -> bool:
    """benefit.png: validation metric against step, mean and min-max over seeds per norm; False without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is missing: `.venv/bin/pip install matplotlib` for the plot (table written anyway)")
        return False
    panels = sorted({(r["task"], r["world"], r["batch"], r["steps"]) for r in records if r["curve"]})
    cols = min(len(panels), 3)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 4 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, (task, world, batch, steps_) in zip(axes.flat, panels):
        for norm in NORMS:
            curves = [r["curve"] for r in records if (r["task"], r["world"], r["batch"], r["steps"], r["norm"]) ==
                      (task, world, batch, steps_, norm) and r["curve"]]
            if not curves:
                continue
            length = min(len(c) for c in curves)
            steps = [c[0] for c in curves[0][:length]]
            values = [[c[i][1] for c in curves] for i in range(length)]
            label = f"bn, 1 process x {world * batch}" if norm == "ref" else norm
            line, = ax.plot(steps, [statistics.fmean(v) for v in values], marker="o", label=label)
            ax.fill_between(steps, [min(v) for v in values], [max(v) for v in values], alpha=0.15,
                            color=line.get_color())
        ax.set_title(f"{task}: {world} processes x {batch} images, {steps_} steps")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(f"validation {METRIC[task]}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def parse(argv: list[str]) -> argparse.Namespace:
    """Command-line arguments; extra Hydra overrides for every run go after `--`."""
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke test: 1 seed, W=2, 8 steps, tiny validation")
    p.add_argument("--out", default="outputs/syncbn_benefit")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--tasks", nargs="+", choices=sorted(TASKS), default=["cls", "seg"])
    p.add_argument("--worlds", type=int, nargs="+", default=[2])
    p.add_argument("--batch", type=int, nargs="+", default=[2], help="images per process")
    p.add_argument("--steps", type=int, default=120, help="optimizer steps per run")
    p.add_argument("--evals", type=int, default=4, help="validations per run (one per epoch)")
    p.add_argument("--spread", type=float, default=1.0, help="data.photometric_spread")
    p.add_argument("--report-only", action="store_true",
                   help="train nothing: table and plot from every run finished under --out")
    args = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    args.overrides = extra
    if args.quick:
        args.seeds, args.worlds, args.steps, args.evals = args.seeds[:1], [2], 8, 2
        args.overrides = ["data.val_size=8", *extra]  # after the task's own val_size: this one wins
    return args


def main(argv: list[str] | None = None) -> int:
    """Run every planned run, then write results.json, table.md and benefit.png."""
    args = parse(list(sys.argv[1:] if argv is None else argv))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    records = finished(out) if args.report_only else []
    for run in [] if args.report_only else plan(args):
        record = execute(run, out)
        records.append(record)
        final = record["curve"][-1][1] if record["curve"] else float("nan")
        print(f"{run.name}: rc={record['returncode']} final {METRIC[run.task]}={final:.3f} "
              f"({record['wall_s']:.0f} s)", flush=True)
    summary = summarise(records)
    table = markdown_table(summary)
    (out / "results.json").write_text(json.dumps({"args": vars(args), "records": records, "summary": summary,
                                                  "wall_s": time.monotonic() - started}, indent=1))
    (out / "table.md").write_text(table + "\n")
    plot(records, out / "benefit.png")
    print(table)
    print(f"total {time.monotonic() - started:.0f} s")
    return 0 if all(r["returncode"] == 0 for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
