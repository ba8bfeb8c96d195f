"""Per training step: BatchNorm, SyncBN with the gather exchange, SyncBN with its two all_reduces, on a fake group.

    python scripts/bench_exchange_host.py --device {cpu,cuda} --world-size 8 --model resnet50
                                          --dtype {float32,bfloat16} [--channels-last] --batch N --rounds R
                                          --json OUT.json [--image-size 224] [--steps 5]

One process joins PyTorch's fake process group (torch.testing._internal.distributed.fake_pg) as rank 0 of
--world-size: every collective returns at once without communicating, so the designs differ only in what the
host does and in what makes it wait for the device. For a torchvision model (random weights, --image-size px
images, --batch per rank, bf16 under autocast for --dtype bfloat16, optionally channels_last), per design:
  bn          the model's own nn.BatchNorm2d layers (no collective)
  gather      src.syncbn.SyncBatchNorm with exchange="all_gather" (one collective of W rows per layer)
  two_reduces src.syncbn.SyncBatchNorm as it trains (two all_reduces per layer, no host read)
it times forward + loss + backward (no optimizer step), --steps steps back to back per block, the device
synchronised only at the block's end, in --rounds rounds whose design order rotates. Reported per design (medians
over rounds): step ms (the block's wall time / steps), host ms (the time for Python to issue one step, i.e. until
backward() returns; on a GPU it is below step ms when the host stays ahead of the device), the ratio to bn (the
median over rounds of the ratio within each round), the host reads of one step (aten._local_scalar_dense and the
like, counted in one untimed step) and, on a GPU, the device synchronisations of one step
(torch.cuda.set_sync_debug_mode("warn"), another untimed step). Prints a Markdown table and writes the JSON.
Needs only torch, torchvision and src.syncbn (no Hydra); on a GPU the SyncBN CUDA extension is built or loaded
first (untimed), and the first steps of each design are warm-up.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DESIGNS = ("bn", "gather", "two_reduces")
WARMUP_STEPS = 2


def build(model_name: str, design: str, device: torch.device, channels_last: bool) -> torch.nn.Module:
    """The torchvision model (random weights, same seed for every design) with the design's norm layers."""
    import torchvision

    from src.syncbn import SyncBatchNorm, convert_sync_batchnorm

    torch.manual_seed(0)
    model = torchvision.models.get_model(model_name, weights=None)
    if design != "bn":
        model = convert_sync_batchnorm(model)
        for layer in model.modules():
            if isinstance(layer, SyncBatchNorm):
                layer.exchange = "all_gather" if design == "gather" else "all_reduce"
    model = model.to(device).train()
    return model.to(memory_format=torch.channels_last) if channels_last else model


def make_step(model: torch.nn.Module, x: torch.Tensor, target: torch.Tensor, dtype: torch.dtype) -> Callable[[], None]:
    """One forward + loss + backward (bf16 under autocast); gradients are overwritten, never stepped."""
    autocast = dtype != torch.float32

    def step() -> None:
        with torch.autocast(x.device.type, dtype=dtype, enabled=autocast):
            loss = F.cross_entropy(model(x), target)
        loss.backward()
        for p in model.parameters():
            p.grad = None

    return step


def count_host_reads(step: Callable[[], None]) -> int:
    """Host reads of tensor data in one step: the operators that hand a device value to Python."""
    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten
    reading = {aten._local_scalar_dense.default, aten.item.default, aten.is_nonzero.default, aten.equal.default}
    unsafe = getattr(torch.Tag, "cudagraph_unsafe", None)  # a tag that an older PyTorch on a GPU node may lack
    count = 0

    class Reads(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
            nonlocal count
            count += func in reading or (unsafe is not None and unsafe in func.tags)
            return func(*args, **(kwargs or {}))

    with Reads():
        step()
    return count


def count_device_syncs(step: Callable[[], None]) -> int:
    """CUDA synchronisations (host waits for the device) in one step, as PyTorch's sync debug mode reports them."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message) for w in caught)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every design's step and host times over the rounds; the fake group is formed here and torn down."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        from src.syncbn.extension import load_extension

        load_extension()  # built or loaded before any timing
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=args.world_size)
    try:
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(args.batch, 3, args.image_size, args.image_size, generator=gen).to(device)
        if args.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        target = torch.randint(0, 1000, (args.batch,), generator=gen).to(device)
        steps = {d: make_step(build(args.model, d, device, args.channels_last), x, target, dtype) for d in DESIGNS}
        reads, syncs = {}, {}
        for design, step in steps.items():
            for _ in range(WARMUP_STEPS):
                step()
            sync()
            reads[design] = count_host_reads(step)
            syncs[design] = count_device_syncs(step) if device.type == "cuda" else None
            sync()
        step_s: dict[str, list[float]] = {d: [] for d in DESIGNS}
        host_s: dict[str, list[float]] = {d: [] for d in DESIGNS}
        for r in range(args.rounds):
            for design in DESIGNS[r % len(DESIGNS):] + DESIGNS[:r % len(DESIGNS)]:
                step = steps[design]
                sync()
                start = time.perf_counter()
                issued = []
                for _ in range(args.steps):
                    t0 = time.perf_counter()
                    step()
                    issued.append(time.perf_counter() - t0)
                sync()
                step_s[design].append((time.perf_counter() - start) / args.steps)
                host_s[design].append(statistics.median(issued))
    finally:
        dist.destroy_process_group()
    out = {}
    for design in DESIGNS:
        out[design] = {"step_ms": statistics.median(step_s[design]) * 1e3,
                       "host_ms": statistics.median(host_s[design]) * 1e3, "host_reads_per_step": reads[design],
                       "device_syncs_per_step": syncs[design],
                       "step_ms_per_round": [t * 1e3 for t in step_s[design]]}
    for design in DESIGNS:  # each round's own ratio first: the machine's load drifts between rounds, not within one
        out[design]["step_vs_bn"] = statistics.median(t / b for t, b in zip(step_s[design], step_s["bn"]))
    return out


def table(results: dict[str, Any]) -> str:
    """Markdown, one row per design."""
    rows = ["| design | step ms | host ms (issue one step) | step / bn | host reads per step | device syncs per step |",
            "|---|---|---|---|---|---|"]
    for design in DESIGNS:
        r = results[design]
        syncs = "-" if r["device_syncs_per_step"] is None else r["device_syncs_per_step"]
        rows.append(f"| {design} | {r['step_ms']:.2f} | {r['host_ms']:.2f} | {r['step_vs_bn']:.3f} | "
                    f"{r['host_reads_per_step']} | {syncs} |")
    return "\n".join(rows)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--world-size", type=int, default=8, help="ranks the fake group pretends to have")
    p.add_argument("--model", default="resnet50", help="a torchvision classification model name")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--batch", type=int, default=32, help="images per rank")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--rounds", type=int, default=5, help="rounds of every design (medians over them)")
    p.add_argument("--steps", type=int, default=5, help="steps per design per round")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    args = p.parse_args(argv)
    if args.world_size < 2 or args.batch < 1 or args.rounds < 1 or args.steps < 1:
        p.error("--world-size must be >= 2, --batch, --rounds and --steps >= 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA GPU is visible")
    return args


def main(argv: list[str] | None = None) -> int:
    """Measure, print the table, write the JSON."""
    args = parse(argv)
    started = time.monotonic()
    results = measure(args)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"{args.model}, {args.dtype}{', channels_last' if args.channels_last else ''}, batch {args.batch} per rank "
          f"of a fake group of {args.world_size}, {args.image_size} px, on {device}; torch {torch.__version__}; "
          f"medians of {args.rounds} rounds x {args.steps} steps\n")
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps({"config": config, "device": device, "torch": torch.__version__,
                                         "wall_s": time.monotonic() - started, "results": results}, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
