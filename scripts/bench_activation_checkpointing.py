"""Peak memory and step time of training with and without trainer.activation_checkpointing, on the CPU.

    python scripts/bench_activation_checkpointing.py [--models resnet50,deeplabv3plus] [--steps 4]
                                                     [--threads 2] [--json out.json]

Each (model, checkpointing) pair runs in a fresh Python process, so one variant's freed memory never
hides the other's peak: build the model (norm=syncbn, one process: our kernels, no communication),
a batch and an SGD optimizer without momentum (no optimizer state), record the resident set size,
then train `--steps` steps. The peak is the process's maximum resident set size (getrusage) minus that
baseline: activations, gradients and the kernels' workspaces at their highest. Step time is the median
of the steps after the first. The variants alternate (plain, checkpointed, plain, ...) with --repeats.

Models: resnet50 = torchvision's ResNet-50 at 224x224, batch 4 (stages layer1..layer4 checkpointed);
deeplabv3plus = the shapes_seg DeepLabV3+ recipe's model (ResNet-18 trunk, output stride 16, head 64,
decoder stride 2, aux head) at 64x64, batch 32 in float32 (the recipe trains in bf16 autocast), its
backbone's stages checkpointed. Prints one line per run and a JSON summary.

    python scripts/bench_activation_checkpointing.py --paired [--rounds 10] [--models ...] [--threads 2]

times the recomputation's cost in one process instead: two copies of the model from the same seed, one
checkpointed, take turns one training step each (plain, checkpointed, plain, ...; who goes first
alternates per round), and the per-round ratio checkpointed/plain step time is reported as a median
with quartiles. Separate processes minutes apart see different machine load (a shared VM's steps swing
by 2-3x); turns a second apart see the same. Memory is not measured in this mode (both copies share the
process).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# key -> (model config, per-pixel targets (a segmenter) or one class per image, batch, image side, classes)
MODELS = {
    "resnet50": ({"name": "resnet50"}, False, 4, 224, 1000),
    "deeplabv3plus": ({"name": "deeplabv3plus_resnet18", "output_stride": 16, "head_channels": 64,
                       "decoder_stride": 2, "aux_loss_weight": 0.5, "zero_init_residual": True},
                      True, 32, 64, 6),
}


def _rss_kib() -> int:
    """Current resident set size in KiB (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _variant(model_key: str, checkpointed: bool) -> tuple[Callable[[], float], Callable[[], None]]:
    """A fresh model (seed 0, norm=syncbn) with its SGD optimizer, batch and targets: (step, prime).

    step() trains one step and returns its seconds; prime() runs an eval-mode forward of two images, which
    loads the kernels without training.
    """
    import torch
    import torch.nn.functional as F

    from src.models import build_model, model_family
    from src.models.activation_checkpointing import enable_activation_checkpointing

    cfg, per_pixel, batch, size, classes = MODELS[model_key]
    torch.manual_seed(0)
    model = build_model(cfg, {"name": "syncbn"}, classes).train()
    if checkpointed:
        enable_activation_checkpointing(model, model_family(cfg["name"]))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(batch, 3, size, size)
    y = torch.randint(0, classes, (batch, size, size) if per_pixel else (batch,))

    def step() -> float:
        t0 = time.perf_counter()
        out = model(x)
        loss = (F.cross_entropy(out["out"], y) + 0.5 * F.cross_entropy(out["aux"], y) if per_pixel
                else F.cross_entropy(out, y))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    def prime() -> None:
        model.eval()(x[:2])
        model.train()

    return step, prime


def child(model_key: str, checkpointed: bool, steps: int, threads: int) -> dict:
    """One variant in this process: peak memory above the pre-training baseline and step times."""
    import torch

    torch.set_num_threads(threads)
    step, prime = _variant(model_key, checkpointed)
    prime()  # loads the kernels outside the measurement
    baseline = _rss_kib()
    times = [step() for _ in range(steps)]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"model": model_key, "checkpointed": checkpointed, "peak_mib": (peak - baseline) / 1024,
            "step_s": statistics.median(times[1:]) if len(times) > 1 else times[0]}


def paired(model_key: str, rounds: int, threads: int) -> dict:
    """Checkpointed/plain step-time ratio from turns in one process: median and quartiles over rounds."""
    import torch

    torch.set_num_threads(threads)
    (plain, _), (ckpt, _) = _variant(model_key, False), _variant(model_key, True)
    plain(), ckpt()  # warm-up: kernels loaded, allocator primed
    ratios, plain_s, ckpt_s = [], [], []
    for i in range(rounds):
        if i % 2:
            c, p = ckpt(), plain()
        else:
            p, c = plain(), ckpt()
        plain_s.append(p)
        ckpt_s.append(c)
        ratios.append(c / p)
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return {"model": model_key, "rounds": rounds, "plain_s": statistics.median(plain_s),
            "checkpointed_s": statistics.median(ckpt_s), "ratio": statistics.median(ratios),
            "ratio_q1": q[0], "ratio_q3": q[2]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet50,deeplabv3plus")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--paired", action="store_true", help="step-time ratio from turns in one process")
    parser.add_argument("--rounds", type=int, default=10, help="with --paired: turns per variant")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "CHECKPOINTED"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1] == "1", args.steps, args.threads)))
        return
    if args.paired:
        results = []
        for model_key in args.models.split(","):
            r = paired(model_key, args.rounds, args.threads)
            results.append(r)
            print(f"{model_key:14s} plain {r['plain_s']:.3f} s, checkpointed {r['checkpointed_s']:.3f} s per step: "
                  f"x{r['ratio']:.2f} ({r['ratio_q1']:.2f}-{r['ratio_q3']:.2f}) over {r['rounds']} rounds", flush=True)
        summary = {"cpu": platform.processor() or platform.machine(), "threads": args.threads, "paired": results}
        print(json.dumps(summary))
        if args.json:
            args.json.write_text(json.dumps(summary, indent=2))
        return
    runs = []
    for model_key in args.models.split(","):
        for _ in range(args.repeats):
            for checkpointed in (False, True):
                argv = [sys.executable, __file__, "--child", model_key, str(int(checkpointed)),
                        "--steps", str(args.steps), "--threads", str(args.threads)]
                out = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=True)
                run = json.loads(out.stdout.strip().splitlines()[-1])
                runs.append(run)
                print(f"{model_key:14s} checkpointing={str(checkpointed).lower():5s} peak +{run['peak_mib']:7.1f} MiB "
                      f"step {run['step_s']:.3f} s", flush=True)
    summary = {"cpu": platform.processor() or platform.machine(), "threads": args.threads, "runs": runs}
    for model_key in args.models.split(","):
        plain = [r for r in runs if r["model"] == model_key and not r["checkpointed"]]
        ckpt = [r for r in runs if r["model"] == model_key and r["checkpointed"]]
        p_mem, c_mem = statistics.median(r["peak_mib"] for r in plain), statistics.median(r["peak_mib"] for r in ckpt)
        p_t, c_t = statistics.median(r["step_s"] for r in plain), statistics.median(r["step_s"] for r in ckpt)
        summary[model_key] = {"peak_saving": 1 - c_mem / p_mem, "time_ratio": c_t / p_t}
        print(f"{model_key}: peak {p_mem:.0f} -> {c_mem:.0f} MiB ({100 * (1 - c_mem / p_mem):.0f}% less), "
              f"step time x{c_t / p_t:.2f}")
    print(json.dumps(summary))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
