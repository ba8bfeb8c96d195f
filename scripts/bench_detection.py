"""Seconds per training step of the detection models on this CPU: forward, backward and an SGD step.

    python scripts/bench_detection.py [--models fcos_resnet18 retinanet_resnet18] [--sizes 96 128]
                                      [--batches 2 4] [--channels 256 128] [--steps 5] [--rounds 3]

One process, one intra-op thread (what each of 2 training processes on a 2-core machine gets), norm=bn
(norm=syncbn adds its all-reduces on top), random images with 3 boxes of 8-48 px each. Every
configuration runs `--steps` timed steps after one warm-up step, and the configurations take turns for
`--rounds` rounds so that drift in a shared machine's load hits all of them; the medians over all timed
steps are printed, wall clock and this process's CPU time (the latter is robust to other jobs on the
machine). Prints a table and one JSON line per configuration.
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from src.models import build_model  # noqa: E402

NUM_CLASSES = 4  # background + 3 object classes
BOXES_PER_IMAGE = 3


def batch(size: int, n: int, gen: torch.Generator) -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]:
    """n random images of size x size in 0..1, each with BOXES_PER_IMAGE boxes of 8-48 px inside it."""
    images = [torch.rand(3, size, size, generator=gen) for _ in range(n)]
    targets = []
    for _ in range(n):
        wh = 8 + 40 * torch.rand(BOXES_PER_IMAGE, 2, generator=gen)
        xy = torch.rand(BOXES_PER_IMAGE, 2, generator=gen) * (size - wh)
        targets.append({"boxes": torch.cat([xy, xy + wh], 1),
                        "labels": torch.randint(1, NUM_CLASSES, (BOXES_PER_IMAGE,), generator=gen)})
    return images, targets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["fcos_resnet18", "retinanet_resnet18", "fasterrcnn_resnet18"])
    parser.add_argument("--sizes", nargs="+", type=int, default=[96, 128])
    parser.add_argument("--batches", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--channels", nargs="+", type=int, default=[256], help="model.head_channels values")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per configuration and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    configs = list(itertools.product(args.models, args.channels, args.sizes, args.batches))
    models, wall, cpu = {}, {c: [] for c in configs}, {c: [] for c in configs}
    for name, channels in itertools.product(args.models, args.channels):
        torch.manual_seed(0)
        models[name, channels] = build_model({"name": name, "head_channels": channels}, {"name": "bn"},
                                             NUM_CLASSES).train()
    gen = torch.Generator().manual_seed(0)
    for _ in range(args.rounds):
        for config in configs:
            name, channels, size, n = config
            model = models[name, channels]
            opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
            for step in range(args.steps + 1):  # step 0: warm-up (allocator, first-call costs)
                images, targets = batch(size, n, gen)
                t0, c0 = time.perf_counter(), time.process_time()
                loss = sum(model(images, targets).values())
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                if step:
                    wall[config].append(time.perf_counter() - t0)
                    cpu[config].append(time.process_time() - c0)
    print(f"| model | head_channels | image px | batch | s/step (wall) | s/step (CPU) |\n|---|---|---|---|---|---|")
    for config in configs:
        name, channels, size, n = config
        row = {"model": name, "head_channels": channels, "size": size, "batch": n,
               "s_per_step": statistics.median(wall[config]), "cpu_s_per_step": statistics.median(cpu[config])}
        print(f"| {name} | {channels} | {size} | {n} | {row['s_per_step']:.3f} | {row['cpu_s_per_step']:.3f} |")
    for config in configs:
        name, channels, size, n = config
        print(json.dumps({"model": name, "head_channels": channels, "size": size, "batch": n,
                          "s_per_step": round(statistics.median(wall[config]), 4),
                          "cpu_s_per_step": round(statistics.median(cpu[config]), 4)}))


if __name__ == "__main__":
    main()
