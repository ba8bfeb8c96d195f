"""Run one function on W real gloo processes (loopback) and bring each rank's result back to the test.

One spawn serves a whole group of cases (the function loops over them), because starting W Python
processes with torch costs seconds on 2 cores. Safety nets, so a bug fails a test instead of hanging CI:
every collective has the process group's timeout, the parent joins with a deadline and kills
stragglers, and a child's traceback is reported by the parent.
"""
from __future__ import annotations

import datetime
import importlib.util
import multiprocessing as mp
import os
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

COLLECTIVE_TIMEOUT_S = 60.0  # one collective on loopback takes milliseconds; 60 s means a lost peer
JOIN_TIMEOUT_S = 240.0  # a whole group of cases; far above what they take (tens of seconds)


def _use_parent_kernels(library: Optional[str]) -> None:
    """Import the very library the parent loaded (no rebuild, even if csrc/ changed since)."""
    if not library or not Path(library).exists():
        return  # not a file-backed module: the child loads the extension itself
    from src.syncbn import functions

    spec = importlib.util.spec_from_file_location(Path(library).name.split(".")[0], library)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    functions.use_kernel_module(module)


def _child(
    rank: int, world: int, tmp: str, fn: Callable[[int, int, Any], Any], collective_timeout_s: float,
    library: Optional[str],
) -> None:
    torch.set_num_threads(1)  # 2 cores shared by several processes: no oversubscription
    out = Path(tmp) / f"rank{rank}.pt"
    try:
        _use_parent_kernels(library)
        payload = torch.load(Path(tmp) / "payload.pt", weights_only=False)
        # A file store needs no port: no race with other tests picking "free" ports at the same time.
        dist.init_process_group(
            "gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world,
            timeout=datetime.timedelta(seconds=collective_timeout_s),
        )
        result = fn(rank, world, payload)
        torch.save({"ok": result}, out)
    except BaseException:  # reported by the parent with the rank
        torch.save({"error": traceback.format_exc()}, out)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_group(
    world: int,
    fn: Callable[[int, int, Any], Any],
    payload: Any,
    tmp_path: Path,
    *,
    join_timeout_s: float = JOIN_TIMEOUT_S,
    collective_timeout_s: float = COLLECTIVE_TIMEOUT_S,
) -> list[Any]:
    """fn(rank, world, payload) on `world` gloo processes; returns the per-rank results (rank order).

    `fn` must be a module-level function (spawned children import it). Raises AssertionError with every
    failing rank's traceback, or when a child is still running after `join_timeout_s`.
    """
    # Build (or load) the kernel extension here first, under pytest's own timeout: a first-time compile
    # inside the children would eat into the join deadline. The children then import this very library.
    from src.syncbn.functions import kernel_ops

    ops = kernel_ops()
    library = ops.library if ops.traceable else None  # other kernels (the emulation) the children pick themselves
    tmp_path.mkdir(parents=True, exist_ok=True)
    torch.save(payload, tmp_path / "payload.pt")
    ctx = mp.get_context("spawn")
    env_backup = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the children before torch starts its pool
    try:
        procs = [
            ctx.Process(target=_child, args=(r, world, str(tmp_path), fn, collective_timeout_s, library),
                        daemon=True)
            for r in range(world)
        ]
        for p in procs:
            p.start()
    finally:
        if env_backup is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = env_backup

    deadline = datetime.datetime.now() + datetime.timedelta(seconds=join_timeout_s)
    for p in procs:
        p.join(max(0.0, (deadline - datetime.datetime.now()).total_seconds()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for r in hung:
        procs[r].kill()
        procs[r].join(5)

    results, errors = [], []
    for r in range(world):
        f = tmp_path / f"rank{r}.pt"
        if not f.exists():
            errors.append(f"rank {r}: no result (exit code {procs[r].exitcode}{', killed after timeout' if r in hung else ''})")
            results.append(None)
            continue
        res = torch.load(f, weights_only=False)
        if "error" in res:
            errors.append(f"rank {r} raised:\n{res['error']}")
            results.append(None)
        else:
            results.append(res["ok"])
    if errors:
        raise AssertionError("multi-process run failed:\n" + "\n".join(errors))
    return results
