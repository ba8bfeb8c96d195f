"""Self-check of our SyncBN CUDA kernels on the user's own GPU, before they train anything.

The CUDA kernels (csrc/cuda/) are tested in every `make test` under a CPU emulation, but a GPU can still
differ (a race, the memory model, a compiler or driver bug on that architecture). So before a process
first trains with them on a GPU, `ensure_cuda_kernels_checked` runs each of the five ops on a few small
cases (selfcheck_cases.py: both layouts, fp32/fp16/bf16/fp64, vector tails, an empty rank, a plane split)
and compares them with PyTorch's own CUDA SyncBN kernels on the same device (`torch.batch_norm_stats`,
`_gather_stats_with_counts`, `_elemt`, `_backward_reduce`, `_backward_elemt`) and with a float64
reference. A pass is remembered on disk (selfcheck.json in the extension cache directory) per GPU name,
compute capability, CUDA runtime, driver and build, so later runs skip it (well under a second of GPU
time either way).

The very same `run_selfcheck` runs in `make test` on the emulated build (CPU tensors; PyTorch has no CPU
version of those ops, so the float64 reference alone is the judge there), and against an emulated variant
built with one deliberately wrong result (SYNCTRAIN_SELFCHECK_FAULT), which it must catch.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import torch

from . import selfcheck_cases as sc

log = logging.getLogger(__name__)

MODES = ("error", "fallback", "off")
WAY_OUT = ("train with norm=torch_syncbn (PyTorch's nn.SyncBatchNorm, same checkpoints), or set "
           "norm.cuda_selfcheck=fallback to switch to it automatically; please report the message above")


class SelfCheckError(RuntimeError):
    """Our CUDA kernels disagreed with the references on this device (op, case, difference, way out)."""


@dataclass
class SelfCheckReport:
    """What a passed self-check covered."""

    device: str
    cases: list[str] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    references: list[str] = field(default_factory=list)
    comparisons: int = 0
    seconds: float = 0.0

    def summary(self) -> str:
        """One log line: ops, cases, dtypes, references, time."""
        return (f"SyncBN CUDA self-check passed on {self.device}: {len(sc.OPS)} ops x {len(self.cases)} cases "
                f"({', '.join(self.cases)}) x {len(self.dtypes)} dtypes ({', '.join(self.dtypes)}), "
                f"{self.comparisons} comparisons against {' and '.join(self.references)} in {self.seconds:.2f} s")


class _Checker:
    """Runs one case's op chain and compares each output; raises SelfCheckError on the first disagreement."""

    def __init__(self, ops: ModuleType, device: torch.device, use_torch: bool, report: SelfCheckReport) -> None:
        self.ops, self.device, self.use_torch, self.report = ops, device, use_torch, report

    def check(self, op: str, case: str, dtype: torch.dtype, what: str, actual: torch.Tensor,
              expected: torch.Tensor, tol: float, against: str) -> None:
        """Compare one output; a disagreement raises with everything needed to reproduce and report it."""
        self.report.comparisons += 1
        bad = sc.compare(actual, expected, tol)
        if bad is None:
            return
        diff, allowed, index = bad
        got = actual.detach().double().cpu().reshape(-1)
        want = expected.detach().double().cpu().reshape(-1)
        at = (f" at flat index {index} (got {float(got[index]):.6g}, expected {float(want[index]):.6g})"
              if 0 <= index < got.numel() else f" (shape {tuple(actual.shape)} vs {tuple(expected.shape)})")
        raise SelfCheckError(
            f"SyncBN CUDA self-check failed on {self.report.device}: op {op}, case {case} {str(dtype)[6:]}, "
            f"output {what} vs {against}: max abs difference {diff:.3g}{at}, allowed {allowed:.3g} "
            f"(tolerance {tol:g} relative). Our CUDA kernels must not train here: {WAY_OUT}.")

    def run_case(self, case: sc.Case, dtype: torch.dtype) -> None:
        """The forward and backward chain of SyncBatchNorm over the case's simulated ranks."""
        ops, name = self.ops, case.name
        red_tol = sc.REDUCE_TOL.get(dtype, sc.REDUCE_TOL_DEFAULT)
        el_tol = sc.ELEMENT_TOL[dtype]
        acc = sc.acc_dtype(dtype)
        xs, dys, w, b = sc.make_case_inputs(case, dtype, self.device)
        c = case.shape[1]
        f64 = "float64"
        # 1. stats per rank
        stats = [ops.batch_norm_stats(x) for x in xs]
        for x, st in zip(xs, stats):
            self.check("batch_norm_stats", name, dtype, "[count, mean, M2]", st, sc.ref_stats(x), red_tol, f64)
            if self.use_torch and x.shape[0] > 0:
                t_mean, t_invstd = torch.batch_norm_stats(x, sc.EPS)
                n = float(st[0])
                self.check("batch_norm_stats", name, dtype, "mean", st[1:1 + c], t_mean, red_tol,
                           "torch.batch_norm_stats")
                self.check("batch_norm_stats", name, dtype, "local invstd", torch.rsqrt(st[1 + c:] / n + sc.EPS),
                           t_invstd, red_tol, "torch.batch_norm_stats")
        # 2. one gather (running statistics in the parameters' dtype, as in the module)
        rows = torch.stack(stats)
        rm = torch.zeros(c, dtype=w.dtype, device=self.device)
        rv = torch.ones(c, dtype=w.dtype, device=self.device)
        mean, invstd, count = ops.batch_norm_gather_stats(rows, rm, rv, None, sc.MOMENTUM, sc.EPS,
                                                          acc == torch.float64)
        r_mean, r_invstd, r_n, r_rm, r_rv = sc.ref_gather(rows, torch.zeros(c), torch.ones(c))
        op = "batch_norm_gather_stats"
        for what, a, e in (("mean", mean, r_mean), ("invstd", invstd, r_invstd), ("count", count.view(1), r_n.view(1)),
                           ("running_mean", rm, r_rm), ("running_var", rv, r_rv)):
            self.check(op, name, dtype, what, a, e, red_tol, f64)
        if self.use_torch:
            live = [i for i, x in enumerate(xs) if x.shape[0] > 0]  # nn.SyncBatchNorm drops empty ranks
            t_stats = [torch.batch_norm_stats(xs[i], sc.EPS) for i in live]
            t_rm = torch.zeros(c, dtype=w.dtype, device=self.device)
            t_rv = torch.ones(c, dtype=w.dtype, device=self.device)
            counts = torch.tensor([float(xs[i].numel() // c) for i in live], dtype=acc, device=self.device)
            t_mean, t_invstd = torch.batch_norm_gather_stats_with_counts(
                xs[live[0]], torch.stack([s[0] for s in t_stats]), torch.stack([s[1] for s in t_stats]),
                t_rm, t_rv, sc.MOMENTUM, sc.EPS, counts)
            for what, a, e in (("mean", mean, t_mean), ("invstd", invstd, t_invstd), ("running_mean", rm, t_rm),
                               ("running_var", rv, t_rv)):
                self.check(op, name, dtype, what, a, e, red_tol, "torch.batch_norm_gather_stats_with_counts")
        # 3. elemt per rank, 4. backward_reduce per rank and their sum (the all_reduce)
        reduced = torch.zeros(2 * c, dtype=acc, device=self.device)
        for x, dy in zip(xs, dys):
            y = ops.batch_norm_elemt(x, w, b, mean, invstd)
            self.check("batch_norm_elemt", name, dtype, "y", y, sc.ref_elemt(x, w, b, mean, invstd), el_tol, f64)
            red = ops.batch_norm_backward_reduce(dy, x, mean, invstd)
            self.check("batch_norm_backward_reduce", name, dtype, "[sum_dy, sum_dy_xhat]", red,
                       sc.ref_backward_reduce(dy, x, mean, invstd), red_tol, f64)
            if self.use_torch and x.shape[0] > 0:
                self.check("batch_norm_elemt", name, dtype, "y", y,
                           torch.batch_norm_elemt(x, w, b, mean, invstd, sc.EPS), el_tol, "torch.batch_norm_elemt")
                t_sum_dy, t_sum_dy_xmu, _, _ = torch.batch_norm_backward_reduce(dy, x, mean, invstd, w, True,
                                                                                False, False)
                self.check("batch_norm_backward_reduce", name, dtype, "[sum_dy, sum_dy_xhat]", red,
                           torch.cat([t_sum_dy, t_sum_dy_xmu * invstd]), red_tol, "torch.batch_norm_backward_reduce")
            reduced += red
        # 5. backward_elemt per rank with the global sums and count
        int_counts = torch.tensor([x.numel() // c for x in xs if x.shape[0] > 0], dtype=torch.int32,
                                  device=self.device)
        for x, dy in zip(xs, dys):
            dx = ops.batch_norm_backward_elemt(dy, x, mean, invstd, w, reduced, count)
            self.check("batch_norm_backward_elemt", name, dtype, "dx", dx,
                       sc.ref_backward_elemt(dy, x, mean, invstd, w, reduced, count), el_tol, f64)
            if self.use_torch and x.shape[0] > 0:
                t_dx = torch.batch_norm_backward_elemt(dy, x, mean, invstd, w, reduced[:c], reduced[c:] / invstd,
                                                       int_counts)
                self.check("batch_norm_backward_elemt", name, dtype, "dx", dx, t_dx, el_tol,
                           "torch.batch_norm_backward_elemt")


def run_selfcheck(ops: ModuleType, device: torch.device | str, *, device_name: str | None = None,
                  cases: tuple[sc.Case, ...] = sc.CASES, dtypes: tuple[torch.dtype, ...] = sc.DTYPES) -> SelfCheckReport:
    """Run every case x dtype through the five `ops` on `device`; raise SelfCheckError on a disagreement.

    On a CUDA device PyTorch's own SyncBN kernels are a second reference; elsewhere (the emulated build on
    CPU tensors) the float64 reference alone is.
    """
    device = torch.device(device)
    use_torch = device.type == "cuda"
    report = SelfCheckReport(device=device_name or str(device))
    report.references = ["float64"] + (["torch.batch_norm_*"] if use_torch else [])
    t0 = time.perf_counter()
    checker = _Checker(ops, device, use_torch, report)
    with torch.no_grad():
        for case in cases:
            for dtype in dtypes:
                checker.run_case(case, dtype)
    if use_torch:
        torch.cuda.synchronize(device)
    report.seconds = time.perf_counter() - t0
    report.cases = [case.name for case in cases]
    report.dtypes = [str(d)[6:] for d in dtypes]
    return report


# --- Remembering a pass --------------------------------------------------------------------------------

def cache_path() -> Path:
    """selfcheck.json in the extension cache directory (SYNCTRAIN_EXTENSIONS_DIR or <repo>/build/...)."""
    from .extension import extensions_dir

    return extensions_dir() / "selfcheck.json"


def _driver_version() -> str:
    """The NVIDIA driver's version (from /proc on Linux), else what torch reports, else 'unknown'."""
    try:
        first = Path("/proc/driver/nvidia/version").read_text().splitlines()[0]
        for token in first.split():
            if token[:1].isdigit() and "." in token:
                return token
    except (OSError, IndexError):
        pass
    getter: Callable[[], Any] | None = getattr(torch._C, "_cuda_getDriverVersion", None)
    try:
        return str(getter()) if getter is not None else "unknown"
    except RuntimeError:
        return "unknown"


def device_key(device: torch.device, build: str) -> str:
    """What a pass is remembered for: GPU name, compute capability, CUDA runtime, driver, build."""
    props = torch.cuda.get_device_properties(device)
    return (f"{props.name} | sm_{props.major}{props.minor} | cuda {torch.version.cuda} | "
            f"driver {_driver_version()} | {build}")


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}  # missing or damaged: check again, then rewrite it


def _remember(path: Path, key: str, report: SelfCheckReport) -> None:
    """Add a pass to the JSON (written to a temporary file, then renamed: readers never see half a file)."""
    data = _read_cache(path)
    data[key] = {"passed": True, "summary": report.summary(), "seconds": round(report.seconds, 3),
                 "checked_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


# --- The gate before training --------------------------------------------------------------------------

def check_mode(mode: str) -> str:
    """Validate a norm.cuda_selfcheck value (raise ValueError naming the key and the choices)."""
    if mode not in MODES:
        raise ValueError(f"norm.cuda_selfcheck must be one of {', '.join(MODES)}; got {mode!r} "
                         "(error: stop before training if our CUDA kernels disagree on this GPU; fallback: use "
                         "torch's nn.SyncBatchNorm then; off: skip the check)")
    return mode


def _all_ranks_passed(passed: bool, device: torch.device) -> bool:
    """True when every rank's self-check passed (ranks must agree on which SyncBN they run)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return passed
    flag = torch.tensor([0 if passed else 1], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item()) == 0


def ensure_cuda_kernels_checked(device: torch.device | str, mode: str = "error", *,
                                ops: ModuleType | None = None, use_cache: bool = True) -> bool:
    """Self-check our kernels on `device` once per (GPU, driver, build); True when they may be used.

    mode "error": a disagreement raises SelfCheckError; "fallback": it logs a warning and returns False
    (the caller switches to nn.SyncBatchNorm; in a process group every rank then does, so all agree);
    "off": no check, True. Not a CUDA device: nothing to check, True.
    """
    check_mode(mode)
    device = torch.device(device)
    if mode == "off" or device.type != "cuda":
        return True
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if ops is None:
        from .extension import load_extension

        ops = load_extension()
    build = Path(getattr(ops, "__file__", "") or "unknown").stem
    key = device_key(device, build)
    path = cache_path()
    failure: SelfCheckError | None = None
    if use_cache and _read_cache(path).get(key, {}).get("passed"):
        log.debug("SyncBN CUDA self-check: already passed for %s (%s)", key, path)
    else:
        try:
            report = run_selfcheck(ops, device, device_name=key)
        except SelfCheckError as err:
            failure = err
        else:
            log.info("%s; remembered in %s", report.summary(), path)
            if use_cache:
                _remember(path, key, report)
    if mode == "error":  # no collective: a failing rank raises, and the launcher stops the others
        if failure is not None:
            raise failure
        return True
    # fallback: exactly one collective on every rank, cached or not, so all ranks pick the same SyncBN
    everyone = _all_ranks_passed(failure is None, device)
    if failure is not None:
        log.warning("%s\nnorm.cuda_selfcheck=fallback: training with torch's nn.SyncBatchNorm instead.", failure)
    elif not everyone:
        log.warning("SyncBN CUDA self-check failed on another rank; norm.cuda_selfcheck=fallback: every rank "
                    "trains with torch's nn.SyncBatchNorm instead.")
    return everyone


def main(argv: list[str] | None = None) -> int:
    """`python -m src.syncbn.selfcheck [--json OUT] [--quick]`: check cuda:0 now (no memory), print the result."""
    import argparse

    parser = argparse.ArgumentParser(description="Self-check our SyncBN CUDA kernels on cuda:0 against PyTorch's.")
    parser.add_argument("--json", type=Path, help="write the result here")
    parser.add_argument("--quick", action="store_true",
                        help="3 cases in float32 and bfloat16 (for compute-sanitizer, which is slow)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("selfcheck: no CUDA GPU visible (torch.cuda.is_available() is False); nothing to check")
        return 2
    from .extension import load_extension

    device = torch.device("cuda", 0)
    ops = load_extension()
    key = device_key(device, Path(getattr(ops, "__file__", "") or "unknown").stem)
    cases, dtypes = (sc.CASES[:3], (torch.float32, torch.bfloat16)) if args.quick else (sc.CASES, sc.DTYPES)
    result: dict[str, Any] = {"device": key}
    try:  # first run as a training process meets it (cold: module load, allocator), then warm
        cold = run_selfcheck(ops, device, device_name=key, cases=cases, dtypes=dtypes)
        report = run_selfcheck(ops, device, device_name=key, cases=cases, dtypes=dtypes)
    except SelfCheckError as err:
        result.update(passed=False, error=str(err))
    else:
        result.update(passed=True, summary=report.summary(), seconds_cold=cold.seconds, seconds=report.seconds,
                      comparisons=report.comparisons)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(result.get("summary") or result["error"])
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
