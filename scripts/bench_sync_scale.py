"""SyncBN's per-step communication as W grows: three ways to exchange the forward's statistics of every layer.

    python scripts/bench_sync_scale.py [--worlds 2 4 8 16 32] [--models resnet50 deeplabv3_resnet50]
                                       [--rounds 3] [--steps 1] [--quick] [--project-only] [--out FILE]

The layer shapes are those of the real torchvision models (built with weights=None): the channel count C
of every BatchNorm2d, in forward order (forward hooks on one 64 px image). Per training step and layer,
the designs exchange:
  gather       forward: one all_gather_into_tensor of the packed float64 [n, mean(C), M2(C)] (2C+1 values),
               src.syncbn.collectives.all_gather_stats (SyncBN's exchange="all_gather"); backward: one
               all_reduce of 2C float32
  shifted      forward: one all_reduce of 2C+1 float64 sums shifted by a per-rank K, the exchange SyncBN had
               before its two sums (its guard then read the result on the host: one device wait per layer,
               which this collective-only measurement does not see); the same backward all_reduce
  two_reduces  forward: an all_reduce of [n, n*mean] (C+1 float64), then one of the deviation sums (C
               float64), the second waiting for the first: SyncBN's exchange (no host read); the same backward

Measured (`--worlds`, one torchrun launch of W gloo ranks on loopback per W, one torch thread per rank,
no model compute: only the collectives of a step, issued with src.syncbn.collectives' functions on
tensors of the real sizes), per design, in interleaved rounds (the designs' order rotates per round, a
barrier before each block):
  - collectives per step: src.syncbn.collectives.call_counts over the timed steps
  - bytes per rank per step, measured two ways: (a) the growth of the rank's /proc/self/io wchar, i.e. the
    bytes gloo's TCP transport passed to write syscalls (payload plus gloo's per-message headers; nothing
    else is written in the timed loop), averaged over ranks: what a rank sends, and on average what it
    receives (every byte sent is received once; gloo receives with recv(), which rchar does not count);
    (b) the growth of
    /sys/class/net/lo/statistics/tx_bytes on rank 0, divided by W (loopback counts every packet once:
    payload plus Ethernet/IP/TCP headers, pure ACKs, and any other loopback traffic on the machine
    meanwhile). Both are shown next to the ring model (all_gather: (W-1)/W x the gathered total each
    way; all_reduce: 2(W-1)/W x the payload each way).
  - time per step and per collective: median over rounds x steps of the slowest rank's time. This is this
    VM's loopback gloo (W processes on its cores), not a projection for GPUs.

Projected (printed after the measurement; alone with --project-only): an alpha-beta model of NCCL's ring and
tree all_reduce and ring all_gather on 8-GPU NVLink nodes joined by 400 Gb/s InfiniBand per GPU
(`nccl_time_us`; constants and sources at `Fabric`), per-step SyncBN communication of every design for
W = 8 ... 1024. Prints Markdown tables and one JSON line (also written to --out).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from scripts.bench_sync_cost import _slowest  # noqa: E402  (per step, the slowest rank's time)

MODELS = ("resnet50", "deeplabv3_resnet50")
DESIGNS = ("gather", "shifted", "two_reduces")
STATS_BYTES, GRAD_BYTES = 8, 4  # forward statistics in float64; backward sums in float32 (a float32 model's acc type)
PROJECT_WORLDS = (8, 16, 32, 64, 128, 256, 512, 1024)
LAUNCH_TIMEOUT_S = 900  # one W: far above what W = 32 takes on 2 cores; a stuck rank fails the run instead


# --------------------------------------------------------------------------------------------- layer shapes
def build_model(name: str) -> Any:
    """The torchvision model, random weights (no download)."""
    import torchvision

    builders = {"resnet50": lambda: torchvision.models.resnet50(weights=None),
                "deeplabv3_resnet50": lambda: torchvision.models.segmentation.deeplabv3_resnet50(
                    weights=None, weights_backbone=None)}
    if name not in builders:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    return builders[name]()


def layer_channels(name: str) -> list[int]:
    """C of every BatchNorm2d of the model, in the order its forward runs them (one 64 px image, eval mode)."""
    import torch

    model = build_model(name).eval()
    order: list[int] = []
    hooks = [m.register_forward_hook(lambda mod, _in, _out: order.append(mod.num_features))
             for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    with torch.no_grad():
        model(torch.zeros(1, 3, 64, 64))
    for h in hooks:
        h.remove()
    if len(order) != len(hooks):  # a layer run twice or never would make the per-step counts wrong
        raise RuntimeError(f"{name}: {len(order)} BatchNorm2d calls in one forward for {len(hooks)} layers")
    return order


# ------------------------------------------------------------------------------------ byte model (any ring)
def ring_bytes(kind: str, payload: int, world: int) -> float:
    """Bytes one rank sends (= receives) in a ring collective: all_gather of `payload` bytes per rank sends
    the W-1 other chunks, (W-1)/W of the gathered total; all_reduce of `payload` bytes (reduce-scatter then
    all-gather) sends 2(W-1)/W x payload."""
    if kind == "all_gather":
        return (world - 1) * payload
    if kind == "all_reduce":
        return 2 * (world - 1) / world * payload
    raise ValueError(f"unknown collective {kind!r}")


def forward_collectives(c: int, design: str) -> list[tuple[str, int]]:
    """(kind, bytes per rank) of the collectives one layer of C channels issues in the forward, in order."""
    if design == "gather":
        return [("all_gather", (2 * c + 1) * STATS_BYTES)]
    if design == "shifted":
        return [("all_reduce", (2 * c + 1) * STATS_BYTES)]
    if design == "two_reduces":
        return [("all_reduce", (c + 1) * STATS_BYTES), ("all_reduce", c * STATS_BYTES)]
    raise ValueError(f"unknown design {design!r}; choose one of {', '.join(DESIGNS)}")


def step_collectives(channels: list[int], design: str) -> list[tuple[str, int]]:
    """(kind, bytes per rank) of every collective one training step issues, forward then backward."""
    forward = [call for c in channels for call in forward_collectives(c, design)]
    backward = [("all_reduce", 2 * c * GRAD_BYTES) for c in reversed(channels)]
    return forward + backward


def modelled_step_bytes(channels: list[int], design: str, world: int) -> float:
    """Ring-model bytes one rank sends (= receives) per training step."""
    return sum(ring_bytes(kind, size, world) for kind, size in step_collectives(channels, design))


# ------------------------------------------------------------------------------------- NCCL alpha-beta model
@dataclass(frozen=True)
class Fabric:
    """An 8-GPU NVLink node per 8 ranks, nodes joined by one 400 Gb/s InfiniBand NIC per GPU.

    Bandwidths, per GPU and direction (GB/s): NVLink 4 of H100/H200 SXM, 18 links x 50 GB/s = 900 GB/s
    bidirectional -> 450 GB/s (NVIDIA H100/H200 datasheets); DGX H100/H200: eight single-port ConnectX-7,
    up to 400 Gb/s InfiniBand NDR, one per GPU -> 50 GB/s (NVIDIA DGX BasePOD reference architecture,
    "Core Components"). Latencies (us) and protocol/algorithm factors: NCCL's own tuning model,
    src/graph/tuning.cc of NCCL 2.7.5 (`baseLat`, `hwLat`, the LL bandwidth factors, the tree bandwidth cap,
    intra-node LL hops x 1.8 across nodes), for the LL (small-message) and Simple protocols; LL128, NVLS,
    CollNet/SHARP and later versions' retuned constants are left out. Bus bandwidth as nccl-tests defines
    it (doc/PERFORMANCE.md: all_reduce busbw = algbw x 2(W-1)/W, all_gather busbw = algbw x (W-1)/W).
    """

    gpus_per_node: int = 8
    nvlink_gbps: float = 450.0
    net_gbps: float = 50.0
    # baseLat[algorithm][protocol]
    base_us: dict = field(default_factory=lambda: {("tree", "LL"): 4.4, ("tree", "Simple"): 0.0,
                                                    ("ring", "LL"): 3.6, ("ring", "Simple"): 8.4})
    # hwLat[link][algorithm][protocol]: one step (hop) of the algorithm over that link
    hop_us: dict = field(default_factory=lambda: {
        ("nvlink", "tree", "LL"): 0.52, ("nvlink", "tree", "Simple"): 28.0,
        ("nvlink", "ring", "LL"): 0.47, ("nvlink", "ring", "Simple"): 3.4,
        ("net", "tree", "LL"): 5.0, ("net", "tree", "Simple"): 50.0,
        ("net", "ring", "LL"): 2.7, ("net", "ring", "Simple"): 9.6})
    tree_max_gbps: float = 80.0  # NCCL caps the tree's bus bandwidth (80 GB/s beyond 2 nodes)


def nccl_candidates(kind: str, nbytes: float, world: int, fabric: Fabric = Fabric()) -> dict[tuple[str, str], float]:
    """Microseconds of one collective per (algorithm, protocol), NCCL's model: latency + nBytes / algbw.

    nbytes: all_reduce: the payload; all_gather: one rank's contribution (NCCL's nBytes is W times it).
    Latency: ring: base + (steps - inter-node steps) x NVLink hop + inter-node steps x network hop, steps =
    2(W-1) for all_reduce, W-1 for all_gather, so it grows linearly in W; tree (all_reduce only): base +
    2 x ((ranks per node - 1) x NVLink hop + log2(nodes) x network hop), so it grows with log W. Bus
    bandwidth: NVLink on one node, the NIC's otherwise; algbw = busbw x W/steps (ring), busbw / 2 (tree).
    """
    if kind not in ("all_reduce", "all_gather"):
        raise ValueError(f"unknown collective {kind!r}")
    if world < 2:
        return {("none", "none"): 0.0}
    per_node = min(world, fabric.gpus_per_node)
    nodes = math.ceil(world / per_node)
    steps = 2 * (world - 1) if kind == "all_reduce" else world - 1
    inter_steps = 2 * (nodes - 1) if kind == "all_reduce" else nodes - 1
    total = nbytes if kind == "all_reduce" else nbytes * world
    busbw = fabric.nvlink_gbps if nodes == 1 else fabric.net_gbps
    out = {}
    for proto in ("LL", "Simple"):
        intra = fabric.hop_us[("nvlink", "ring", proto)] * (1.8 if nodes > 1 and proto == "LL" else 1.0)
        lat = (fabric.base_us[("ring", proto)] + (steps - inter_steps) * intra
               + inter_steps * fabric.hop_us[("net", "ring", proto)])
        bw = busbw / 4 if proto == "LL" and (nodes > 1 or kind == "all_reduce") else busbw / 3 if proto == "LL" else busbw
        out[("ring", proto)] = lat + total / (bw * 1e3 * world / steps)  # GB/s = 1e3 bytes/us
        if kind == "all_reduce":
            intra = fabric.hop_us[("nvlink", "tree", proto)] * (1.8 if nodes > 1 and proto == "LL" else 1.0)
            lat = fabric.base_us[("tree", proto)] + 2 * ((per_node - 1) * intra
                                                         + math.log2(nodes) * fabric.hop_us[("net", "tree", proto)])
            tree_bw = min(busbw * 0.9, fabric.tree_max_gbps) / (3.8 if proto == "LL" else 1.0)
            out[("tree", proto)] = lat + total / (tree_bw * 1e3 * 0.5)
    return out


def nccl_time_us(kind: str, nbytes: float, world: int, fabric: Fabric = Fabric()) -> tuple[float, str]:
    """(microseconds, "algorithm/protocol") of the choice NCCL's model makes: the fastest candidate."""
    (algo, proto), t = min(nccl_candidates(kind, nbytes, world, fabric).items(), key=lambda kv: kv[1])
    return t, f"{algo}/{proto}"


def project(channels: list[int], world: int, fabric: Fabric = Fabric()) -> dict[str, Any]:
    """Modelled NCCL time (us) of one step's SyncBN collectives for every design, and what NCCL picks."""
    out: dict[str, Any] = {"world": world, "nodes": math.ceil(world / fabric.gpus_per_node)}
    for design in DESIGNS:
        calls = step_collectives(channels, design)
        times = [nccl_time_us(kind, size, world, fabric) for kind, size in calls]
        n = len(calls) - len(channels)  # the forward's collectives come first
        out[design] = {"forward_us": sum(t for t, _ in times[:n]), "backward_us": sum(t for t, _ in times[n:]),
                       "step_us": sum(t for t, _ in times), "forward_algo": sorted({a for _, a in times[:n]}),
                       "bytes_per_rank": modelled_step_bytes(channels, design, world)}
    return out


# ------------------------------------------------------------------------------------------- measurement
def _written_bytes() -> int:
    """wchar of this process: bytes passed to write syscalls (gloo's sends to its sockets among them)."""
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["wchar"])


def _lo_bytes() -> int:
    """Bytes the loopback interface has carried (every process on the machine)."""
    try:
        return int(Path("/sys/class/net/lo/statistics/tx_bytes").read_text())
    except OSError:
        return -1


def measure(rank: int, world: int, layers: dict[str, list[int]], rounds: int, steps: int) -> dict[str, Any]:
    """On each rank of the current default group: time and count every design's collectives per model.

    Returns this rank's view; the times are already the slowest rank's per step (same on every rank).
    """
    import torch
    import torch.distributed as dist

    from src.syncbn import collectives

    name = dist.group.WORLD.group_name
    results: dict[str, Any] = {}
    for model, channels in layers.items():
        payloads = {design: [[torch.ones(size // STATS_BYTES, dtype=torch.float64)
                              for _, size in forward_collectives(c, design)] for c in channels] for design in DESIGNS}
        grads = [torch.ones(2 * c, dtype=torch.float32) for c in reversed(channels)]

        def forward(design: str) -> None:
            for layer in payloads[design]:
                for t in layer:  # one after the other: two_reduces' second needs the first's result
                    if design == "gather":
                        collectives.all_gather_stats(t, name, world)
                    else:
                        collectives.all_reduce_stats(t, name)

        def backward() -> None:
            for g in grads:
                collectives.all_reduce_grads(g, name)

        for design in DESIGNS:  # warm-up: gloo's first use of each size allocates its buffers
            forward(design)
            backward()
        fwd: dict[str, list[float]] = {d: [] for d in DESIGNS}
        bwd: dict[str, list[float]] = {d: [] for d in DESIGNS}
        sent: dict[str, int] = {d: 0 for d in DESIGNS}
        lo: dict[str, int] = {d: 0 for d in DESIGNS}
        calls: dict[str, dict[str, int]] = {d: {"all_gather": 0, "all_reduce": 0} for d in DESIGNS}
        for r in range(rounds):
            for design in DESIGNS[r % len(DESIGNS):] + DESIGNS[:r % len(DESIGNS)]:  # the order rotates per round
                dist.barrier()
                lo_start = _lo_bytes() if rank == 0 else 0
                counts = dict(collectives.call_counts)
                sent_start = _written_bytes()
                for _ in range(steps):
                    start = time.perf_counter()
                    forward(design)
                    mid = time.perf_counter()
                    backward()
                    fwd[design].append(mid - start)
                    bwd[design].append(time.perf_counter() - mid)
                sent[design] += _written_bytes() - sent_start
                for key in calls[design]:
                    calls[design][key] += collectives.call_counts[key] - counts[key]
                dist.barrier()  # every rank's traffic of the block is on the wire before rank 0 reads lo again
                if rank == 0:
                    lo[design] += _lo_bytes() - lo_start
        timed = rounds * steps
        out: dict[str, Any] = {"layers": len(channels), "sum_c": sum(channels)}
        for design in DESIGNS:
            f, b = _slowest(fwd[design]), _slowest(bwd[design])
            total_sent = torch.tensor([sent[design] / timed], dtype=torch.float64)
            dist.all_reduce(total_sent)  # the mean over ranks: what a rank sends and, on average, receives
            n = len(channels)  # per layer: "collective" times below are per layer and direction
            out[design] = {
                "calls_per_step": {k: v / timed for k, v in calls[design].items()},
                "sent_bytes_io": total_sent.item() / world,
                "lo_bytes_per_rank": lo[design] / timed / world if rank == 0 else None,
                "model_bytes": modelled_step_bytes(channels, design, world),
                "step_s": statistics.median(x + y for x, y in zip(f, b)),
                "forward_s": statistics.median(f), "backward_s": statistics.median(b),
                "forward_collective_s": statistics.median(f) / n, "backward_collective_s": statistics.median(b) / n,
                "steps_timed": timed,
            }
        results[model] = out
    return results


def _rank_main(job_file: str) -> None:
    """One torchrun rank: form the group, measure, rank 0 writes its result next to the job file."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    job = json.loads(Path(job_file).read_text())
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))  # a lost peer fails, never hangs
    rank, world = dist.get_rank(), dist.get_world_size()
    result = measure(rank, world, job["layers"], job["rounds"], job["steps"])
    if rank == 0:
        Path(job_file).with_suffix(f".w{world}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def launch(world: int, job_file: Path) -> dict[str, Any]:
    """torchrun W ranks of this script on the job; rank 0's result."""
    env = {k: v for k, v in os.environ.items() if k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"}}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
           __file__, "--rank-job", str(job_file)]
    subprocess.run(cmd, cwd=REPO, env=env, check=True, timeout=LAUNCH_TIMEOUT_S, stdout=subprocess.DEVNULL)
    return json.loads(job_file.with_suffix(f".w{world}.json").read_text())


# ------------------------------------------------------------------------------------------------ report
def _fabric_json(fabric: Fabric) -> dict[str, Any]:
    """The model's constants with "link/algorithm/protocol" string keys (JSON has no tuple keys)."""
    return {k: {"/".join(kk): vv for kk, vv in v.items()} if isinstance(v, dict) else v
            for k, v in asdict(fabric).items()}


def _kb(x: float | None) -> str:
    return "-" if x is None else f"{x / 1e3:,.1f}"


def measured_table(measured: dict[int, dict[str, Any]]) -> str:
    """One row per (model, W, design)."""
    rows = ["| model | W | design | collectives/step (gather + all_reduce) | KB/rank/step sent: ring model | "
            "measured: written to sockets | measured: lo / W | ms/step | ms/layer fwd / bwd |",
            "|---|---|---|---|---|---|---|---|---|"]
    for world, per_model in sorted(measured.items()):
        for model, r in per_model.items():
            for design in DESIGNS:
                d = r[design]
                c = d["calls_per_step"]
                rows.append(f"| {model} | {world} | {design} | {c['all_gather']:g} + {c['all_reduce']:g} | "
                            f"{_kb(d['model_bytes'])} | {_kb(d['sent_bytes_io'])} | "
                            f"{_kb(d['lo_bytes_per_rank'])} | {d['step_s'] * 1e3:.1f} | "
                            f"{d['forward_collective_s'] * 1e3:.2f} / {d['backward_collective_s'] * 1e3:.2f} |")
    return "\n".join(rows)


def projection_table(projected: dict[str, list[dict[str, Any]]]) -> str:
    """One row per (model, W): modelled NCCL time per step of each design, and each against two_reduces."""
    head = " | ".join(f"{d}: us/step (fwd + bwd), fwd algo" for d in DESIGNS)
    rows = [f"| model | W (nodes) | {head} | gather / two_reduces | shifted / two_reduces | MB/rank/step sent: "
            f"{' / '.join(DESIGNS)} |", "|---|---|" + "---|" * len(DESIGNS) + "---|---|---|"]
    for model, per_world in projected.items():
        for p in per_world:
            cells = [f"{p[d]['step_us']:,.0f} ({p[d]['forward_us']:,.0f} + {p[d]['backward_us']:,.0f}), "
                     f"{', '.join(p[d]['forward_algo'])}" for d in DESIGNS]
            ratios = [f"{p[d]['step_us'] / p['two_reduces']['step_us']:.2f}x" for d in ("gather", "shifted")]
            sent = " / ".join(f"{p[d]['bytes_per_rank'] / 1e6:.2f}" for d in DESIGNS)
            rows.append(f"| {model} | {p['world']} ({p['nodes']}) | {' | '.join(cells)} | {' | '.join(ratios)} | "
                        f"{sent} |")
    return "\n".join(rows)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line; --quick: W = 2 only, ResNet-50 only, 2 rounds of 1 step (seconds)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worlds", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per design (medians over them)")
    p.add_argument("--steps", type=int, default=1, help="consecutive steps per design per round")
    p.add_argument("--quick", action="store_true", help="smoke run: --worlds 2 --models resnet50 --rounds 2 --steps 1")
    p.add_argument("--project-only", action="store_true", help="only the NCCL projection (no processes)")
    p.add_argument("--out", default="", help="also write the JSON line here")
    p.add_argument("--rank-job", default="", help=argparse.SUPPRESS)  # set by launch() for the ranks
    args = p.parse_args(argv)
    if args.quick:
        args.worlds, args.models, args.rounds, args.steps = [2], ["resnet50"], 2, 1
    if min(args.worlds) < 2 or args.rounds < 1 or args.steps < 1:
        p.error("--worlds must be >= 2 and --rounds/--steps >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    """Measure at each W, project for NCCL, print the tables and the JSON line."""
    args = parse(argv)
    if args.rank_job:
        _rank_main(args.rank_job)
        return 0
    layers = {m: layer_channels(m) for m in args.models}
    measured: dict[int, dict[str, Any]] = {}
    wall: dict[int, float] = {}
    if not args.project_only:
        with tempfile.TemporaryDirectory() as tmp:
            job = Path(tmp) / "job.json"
            job.write_text(json.dumps({"layers": layers, "rounds": args.rounds, "steps": args.steps}))
            for world in args.worlds:
                started = time.monotonic()
                measured[world] = launch(world, job)
                wall[world] = time.monotonic() - started
        print(f"\nMeasured: gloo on loopback, {args.rounds} rounds x {args.steps} steps per design "
              f"(this machine, not a projection); wall time per W (launch included): "
              + ", ".join(f"W={w}: {s:.0f} s" for w, s in wall.items()) + "\n")
        print(measured_table(measured))
    projected = {m: [project(layers[m], w) for w in PROJECT_WORLDS] for m in args.models}
    print(f"\nProjected: NCCL alpha-beta model, {Fabric.gpus_per_node} GPUs per node (see Fabric)\n")
    print(projection_table(projected))
    line = json.dumps({"models": {m: {"layers": len(c), "sum_c": sum(c), "channels": c} for m, c in layers.items()},
                       "rounds": args.rounds, "steps": args.steps, "measured": measured, "wall_s": wall,
                       "projected": projected, "fabric": _fabric_json(Fabric())})
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
