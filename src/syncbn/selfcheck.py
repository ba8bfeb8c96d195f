"""Self-check of our SyncBN CUDA kernels on the user's own GPU, before they train anything.

The CUDA kernels (csrc/cuda/) are tested in every `make test` under a CPU emulation, but a GPU can still
differ (a race, the memory model, a compiler or driver bug on that architecture). So before a process
first trains with them on a GPU, `ensure_cuda_kernels_checked` runs each of the eight ops on a few small
cases (selfcheck_cases.py: both layouts, fp32/fp16/bf16/fp64, vector tails, an empty rank, a plane split)
and compares them with PyTorch's own CUDA SyncBN kernels on the same device (`torch.batch_norm_stats`,
`_gather_stats_with_counts`, `_elemt`, `_backward_reduce`, `_backward_elemt`; the all_reduce exchange's
three ops have no PyTorch counterpart) and with a float64 reference. A pass is remembered on disk (selfcheck.json in the extension cache directory) per GPU name,
compute capability, CUDA runtime, driver and build, so later runs skip it; a cache that cannot be written
only costs a warning. A PyTorch kernel that raises is recorded as "reference unavailable" and the float64
reference decides. In a process group every rank's verdict is reduced (one all_reduce) before any rank
acts, so all ranks raise (norm.cuda_selfcheck=error) or all fall back together, and none is left waiting.

Outside the trainer, each process checks a CUDA device at the first training forward of a SyncBatchNorm
layer on it (`check_first_use`; SYNCTRAIN_SYNCBN_SELFCHECK=error|warn|off), and the ranks of the layer's group
agree on the verdict (one all_reduce there); or when the user calls `check(device)` (e.g. before compiling),
in that process alone unless given a group; a remembered pass makes the check itself free.

The very same `run_selfcheck` runs in `make test` on the emulated build (CPU tensors; PyTorch has no CPU
version of those ops, so the float64 reference alone is the judge there), and against an emulated variant
built with one deliberately wrong result (SYNCTRAIN_SELFCHECK_FAULT), which it must catch.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
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
    unavailable: dict[str, str] = field(default_factory=dict)  # PyTorch reference -> its first error

    def summary(self) -> str:
        """One log line: ops, cases, dtypes, references (and those unavailable), time."""
        line = (f"SyncBN CUDA self-check passed on {self.device}: {len(sc.OPS)} ops x {len(self.cases)} cases "
                f"({', '.join(self.cases)}) x {len(self.dtypes)} dtypes ({', '.join(self.dtypes)}), "
                f"{self.comparisons} comparisons against {' and '.join(self.references)} in {self.seconds:.2f} s")
        if self.unavailable:
            line += ("; reference unavailable (float64 decided): "
                     + "; ".join(f"{name} ({err})" for name, err in sorted(self.unavailable.items())))
        return line


class _Checker:
    """Runs one case's op chain and compares each output; raises SelfCheckError on the first disagreement.

    staged: every input of our kernels that is not another op's output (the gathered rows, the running
    statistics, the summed exchange and gradient sums) is made on the CPU and copied to the device, never
    computed there by a PyTorch kernel: compute-sanitizer's initcheck, watching our kernels only, would not see
    such a kernel write it (`python -m src.syncbn.selfcheck --sanitizer`). It costs host synchronisations.
    """

    def __init__(self, ops: ModuleType, device: torch.device, use_torch: bool, report: SelfCheckReport,
                 staged: bool = False) -> None:
        self.ops, self.device, self.use_torch, self.report, self.staged = ops, device, use_torch, report, staged

    def _combined(self, tensors: list[torch.Tensor],
                  combine: Callable[[list[torch.Tensor]], torch.Tensor]) -> torch.Tensor:
        """combine(tensors) on the device, or (staged) on host copies, its result then copied to the device."""
        if not self.staged:
            return combine(tensors)
        return combine([t.cpu() for t in tensors]).to(self.device)

    def reference(self, name: str, compute: Callable[[], Any]) -> Any | None:
        """PyTorch's kernel `name` as a second reference; None when it raises (no kernel for this dtype or
        device in this torch build, say): recorded as unavailable, and the float64 comparison decides."""
        try:
            return compute()
        except Exception as err:  # noqa: BLE001 - whatever the reference's failure, it is not our kernels'
            if name not in self.report.unavailable:
                first_line = (str(err).splitlines() or [""])[0][:120]
                self.report.unavailable[name] = f"{type(err).__name__}: {first_line}"
                log.warning("SyncBN CUDA self-check: reference %s unavailable (%s); float64 decides",
                            name, self.report.unavailable[name])
            return None

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
            t_stats = (self.reference("torch.batch_norm_stats", lambda x=x: torch.batch_norm_stats(x, sc.EPS))
                       if self.use_torch and x.shape[0] > 0 else None)
            if t_stats is not None:
                t_mean, t_invstd = t_stats
                n = float(st[0])
                self.check("batch_norm_stats", name, dtype, "mean", st[1:1 + c], t_mean, red_tol,
                           "torch.batch_norm_stats")
                self.check("batch_norm_stats", name, dtype, "local invstd", torch.rsqrt(st[1 + c:] / n + sc.EPS),
                           t_invstd, red_tol, "torch.batch_norm_stats")
        # 2. one gather (running statistics in the parameters' dtype, as in the module)
        rows = self._combined(stats, torch.stack)
        rm = torch.zeros(c, dtype=w.dtype).to(self.device)
        rv = torch.ones(c, dtype=w.dtype).to(self.device)
        mean, invstd, count = ops.batch_norm_gather_stats(rows, rm, rv, None, sc.MOMENTUM, sc.EPS,
                                                          acc == torch.float64)
        r_mean, r_invstd, r_n, r_rm, r_rv = sc.ref_gather(rows, torch.zeros(c), torch.ones(c))
        op = "batch_norm_gather_stats"
        for what, a, e in (("mean", mean, r_mean), ("invstd", invstd, r_invstd), ("count", count.view(1), r_n.view(1)),
                           ("running_mean", rm, r_rm), ("running_var", rv, r_rv)):
            self.check(op, name, dtype, what, a, e, red_tol, f64)
        t_gather = (self.reference("torch.batch_norm_gather_stats_with_counts",
                                   lambda: self._torch_gather(xs, c, w.dtype, acc)) if self.use_torch else None)
        if t_gather is not None:
            t_mean, t_invstd, t_rm, t_rv = t_gather
            for what, a, e in (("mean", mean, t_mean), ("invstd", invstd, t_invstd), ("running_mean", rm, t_rm),
                               ("running_var", rv, t_rv)):
                self.check(op, name, dtype, what, a, e, red_tol, "torch.batch_norm_gather_stats_with_counts")
        # 2b. the all_reduce exchange: per-rank mean sums, their sum, per-rank deviation sums, their sum, merged
        sums = [ops.batch_norm_mean_sums(st) for st in stats]
        for st, sm in zip(stats, sums):
            self.check("batch_norm_mean_sums", name, dtype, "[n, n*mean]", sm, sc.ref_mean_sums(st), red_tol, f64)
        total = self._combined(sums, lambda t: torch.stack(t).sum(0))
        devs = [ops.batch_norm_deviation_sums(st, total) for st in stats]
        for st, dv in zip(stats, devs):
            self.check("batch_norm_deviation_sums", name, dtype, "M2 + n*d^2", dv, sc.ref_deviation_sums(st, total),
                       red_tol, f64)
        rm_r = torch.zeros(c, dtype=w.dtype).to(self.device)  # made on the CPU: see `staged`
        rv_r = torch.ones(c, dtype=w.dtype).to(self.device)
        m2 = self._combined(devs, lambda t: torch.stack(t).sum(0))
        outs = ops.batch_norm_reduced_stats(total, m2, rm_r, rv_r, None, sc.MOMENTUM, sc.EPS, acc == torch.float64)
        for what, a, e in zip(("mean", "invstd", "count", "running_mean", "running_var"), (*outs[:2], outs[2].view(1),
                              rm_r, rv_r), (r_mean, r_invstd, r_n.view(1), r_rm, r_rv)):
            self.check("batch_norm_reduced_stats", name, dtype, what, a, e, red_tol, f64)
        # 3. elemt per rank, 4. backward_reduce per rank and their sum (the all_reduce)
        reds = []
        for x, dy in zip(xs, dys):
            y = ops.batch_norm_elemt(x, w, b, mean, invstd)
            self.check("batch_norm_elemt", name, dtype, "y", y, sc.ref_elemt(x, w, b, mean, invstd), el_tol, f64)
            red = ops.batch_norm_backward_reduce(dy, x, mean, invstd)
            self.check("batch_norm_backward_reduce", name, dtype, "[sum_dy, sum_dy_xhat]", red,
                       sc.ref_backward_reduce(dy, x, mean, invstd), red_tol, f64)
            if self.use_torch and x.shape[0] > 0:
                t_y = self.reference("torch.batch_norm_elemt",
                                     lambda x=x: torch.batch_norm_elemt(x, w, b, mean, invstd, sc.EPS))
                if t_y is not None:
                    self.check("batch_norm_elemt", name, dtype, "y", y, t_y, el_tol, "torch.batch_norm_elemt")
                t_red = self.reference("torch.batch_norm_backward_reduce",
                                       lambda x=x, dy=dy: torch.batch_norm_backward_reduce(dy, x, mean, invstd, w,
                                                                                           True, False, False))
                if t_red is not None:
                    self.check("batch_norm_backward_reduce", name, dtype, "[sum_dy, sum_dy_xhat]", red,
                               torch.cat([t_red[0], t_red[1] * invstd]), red_tol, "torch.batch_norm_backward_reduce")
            reds.append(red)
        reduced = self._combined(reds, lambda t: torch.stack(t).sum(0))
        # 5. backward_elemt per rank with the global sums and count
        int_counts = torch.tensor([x.numel() // c for x in xs if x.shape[0] > 0], dtype=torch.int32,
                                  device=self.device)
        for x, dy in zip(xs, dys):
            dx = ops.batch_norm_backward_elemt(dy, x, mean, invstd, w, reduced, count)
            self.check("batch_norm_backward_elemt", name, dtype, "dx", dx,
                       sc.ref_backward_elemt(dy, x, mean, invstd, w, reduced, count), el_tol, f64)
            if self.use_torch and x.shape[0] > 0:
                t_dx = self.reference("torch.batch_norm_backward_elemt",
                                      lambda x=x, dy=dy: torch.batch_norm_backward_elemt(
                                          dy, x, mean, invstd, w, reduced[:c], reduced[c:] / invstd, int_counts))
                if t_dx is not None:
                    self.check("batch_norm_backward_elemt", name, dtype, "dx", dx, t_dx, el_tol,
                               "torch.batch_norm_backward_elemt")

    def _torch_gather(self, xs: list[torch.Tensor], c: int, pdt: torch.dtype, acc: torch.dtype):
        """(mean, invstd, running_mean, running_var) as nn.SyncBatchNorm gets them from PyTorch's kernels."""
        live = [i for i, x in enumerate(xs) if x.shape[0] > 0]  # nn.SyncBatchNorm drops empty ranks
        t_stats = [torch.batch_norm_stats(xs[i], sc.EPS) for i in live]
        t_rm = torch.zeros(c, dtype=pdt, device=self.device)
        t_rv = torch.ones(c, dtype=pdt, device=self.device)
        counts = torch.tensor([float(xs[i].numel() // c) for i in live], dtype=acc, device=self.device)
        t_mean, t_invstd = torch.batch_norm_gather_stats_with_counts(
            xs[live[0]], torch.stack([s[0] for s in t_stats]), torch.stack([s[1] for s in t_stats]),
            t_rm, t_rv, sc.MOMENTUM, sc.EPS, counts)
        return t_mean, t_invstd, t_rm, t_rv


def default_cases(device: torch.device, ops: ModuleType | None = None) -> tuple[sc.Case, ...]:
    """On a CUDA device: the fixed cases and those sized for the kernels' resident blocks there (SMs x the
    blocks per SM of `ops.kernel_occupancy`, which counts their registers: selfcheck_cases.py). Elsewhere
    (the emulated build): the fixed cases; callers add sc.device_cases for the emulated device."""
    if device.type != "cuda":
        return sc.CASES
    props = torch.cuda.get_device_properties(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    table = ops.kernel_occupancy(index) if hasattr(ops, "kernel_occupancy") else None
    return sc.cases_for(sc.stats_resident_blocks(table, props.multi_processor_count,
                                                 props.max_threads_per_multi_processor))


def run_selfcheck(ops: ModuleType, device: torch.device | str, *, device_name: str | None = None,
                  cases: tuple[sc.Case, ...] | None = None, dtypes: tuple[torch.dtype, ...] = sc.DTYPES,
                  torch_reference: bool | None = None, staged: bool = False) -> SelfCheckReport:
    """Run every case x dtype through the eight `ops` on `device`; raise SelfCheckError on a disagreement.

    cases: default_cases(device, ops) when None. torch_reference: compare with PyTorch's own SyncBN kernels
    too (default: on a CUDA device; elsewhere, e.g. the emulated build on CPU tensors, the float64
    reference alone judges). A PyTorch kernel that raises is listed in report.unavailable, not a failure.
    staged: the kernels' inputs are made on the CPU and copied (for compute-sanitizer: _Checker says why).
    """
    device = torch.device(device)
    use_torch = device.type == "cuda" if torch_reference is None else torch_reference
    if cases is None:
        cases = default_cases(device, ops)
    report = SelfCheckReport(device=device_name or str(device))
    report.references = ["float64"] + (["torch.batch_norm_*"] if use_torch else [])
    t0 = time.perf_counter()
    checker = _Checker(ops, device, use_torch, report, staged)
    with torch.no_grad():
        for case in cases:
            for dtype in dtypes:
                checker.run_case(case, dtype)
    if device.type == "cuda":
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


def _remembered(path: Path, key: str) -> bool:
    """True when selfcheck.json holds a pass for `key`."""
    entry = _read_cache(path).get(key)
    return isinstance(entry, dict) and entry.get("passed") is True


def _remember(path: Path, key: str, report: SelfCheckReport) -> None:
    """Add a pass to the JSON; never raises. Written to a unique temporary file beside it (mkstemp: no name
    shared with another process, e.g. the same pid in another container using this cache), then renamed,
    so readers never see half a file. A read-only, full or missing folder only costs a warning: the check
    runs again next time."""
    data = _read_cache(path)
    data[key] = {"passed": True, "summary": report.summary(), "seconds": round(report.seconds, 3),
                 "checked_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f"{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(data, indent=1, sort_keys=True) + "\n")
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as err:
        log.warning("SyncBN CUDA self-check passed but could not be remembered in %s (%s: %s); it will run "
                    "again in the next process", path, type(err).__name__, err)


# --- The gate before training --------------------------------------------------------------------------

def check_mode(mode: str) -> str:
    """Validate a norm.cuda_selfcheck value (raise ValueError naming the key and the choices)."""
    if mode not in MODES:
        raise ValueError(f"norm.cuda_selfcheck must be one of {', '.join(MODES)}; got {mode!r} "
                         "(error: stop before training if our CUDA kernels disagree on this GPU; fallback: use "
                         "torch's nn.SyncBatchNorm then; off: skip the check)")
    return mode


def _failed_ranks(failed: bool, device: torch.device, group: str | None = None) -> list[int]:
    """The ranks whose self-check failed, the same list on every rank of the group: one all_reduce (MAX) of a
    flag per rank of `group` (a process group's name, as collectives.resolve_group gives it; None: WORLD).
    The ranks are global ranks. Without a process group: [0] or []."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [0] if failed else []
    pg = None
    if group is not None:
        from torch.distributed.distributed_c10d import _resolve_process_group

        pg = _resolve_process_group(group)
    # NCCL reduces device tensors only; any other backend (gloo, or cpu:gloo,cuda:nccl) takes a CPU tensor.
    where = device if dist.get_backend(pg) == "nccl" else torch.device("cpu")
    flags = torch.zeros(dist.get_world_size(pg), dtype=torch.int32, device=where)
    flags[dist.get_rank(pg)] = int(failed)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=pg)
    ranks = [i for i, f in enumerate(flags.tolist()) if f]
    return ranks if pg is None else [dist.get_global_rank(pg, i) for i in ranks]


def _check_or_recall(ops: ModuleType, device: torch.device, key: str, use_cache: bool,
                     cases: tuple[sc.Case, ...] | None,
                     dtypes: tuple[torch.dtype, ...]) -> SelfCheckReport | SelfCheckError | None:
    """This rank's verdict: its report (passed now), None (a pass remembered), or the failure. Never raises
    an Exception: our kernels raising count as a failure."""
    if use_cache and _remembered(cache_path(), key):
        log.debug("SyncBN CUDA self-check: already passed for %s (%s)", key, cache_path())
        return None
    try:
        return run_selfcheck(ops, device, device_name=key, cases=cases, dtypes=dtypes)
    except SelfCheckError as err:
        return err
    except Exception as err:  # noqa: BLE001 - a raising kernel of ours must not leave the other ranks waiting
        return SelfCheckError(f"SyncBN CUDA self-check failed on {key}: our kernels raised {type(err).__name__}: "
                              f"{err}. Our CUDA kernels must not train here: {WAY_OUT}.")


def _group_failure(failure: SelfCheckError | None, failed: list[int]) -> SelfCheckError:
    """The error this rank raises when the self-check failed on `failed` (global ranks) of its group: its own
    failure's message (what disagreed) or, on a rank that passed, the failing ranks'."""
    where = f"rank{'s' if len(failed) > 1 else ''} {', '.join(map(str, failed))}"
    if failure is not None:
        return SelfCheckError(f"{failure} (the self-check failed on {where})")
    return SelfCheckError(f"SyncBN CUDA self-check failed on {where} (this rank passed; that rank's log says "
                          f"what disagreed). Our CUDA kernels must not train here: {WAY_OUT}.")


def agree_on_selfcheck(ops: ModuleType, device: torch.device | str, mode: str, key: str, *, use_cache: bool = True,
                       cases: tuple[sc.Case, ...] | None = None,
                       dtypes: tuple[torch.dtype, ...] = sc.DTYPES) -> bool:
    """Check `ops` on `device` (or recall a pass for `key`), agree with every rank, then act alike.

    Every rank makes exactly one collective, cached or not, failed or not, before acting on the verdict:
    mode "error": if any rank failed, every rank raises SelfCheckError naming the failing ranks (the
    failing rank's own message says what disagreed); "fallback": every rank logs it and returns False.
    True when all ranks passed; only then is the pass remembered (ranks with the same GPU model share a
    key, so a pass on one rank must not stand for a failing one next time).
    """
    check_mode(mode)
    device = torch.device(device)
    verdict = _check_or_recall(ops, device, key, use_cache, cases, dtypes)
    failure = verdict if isinstance(verdict, SelfCheckError) else None
    failed = _failed_ranks(failure is not None, device)
    if not failed:
        if isinstance(verdict, SelfCheckReport):
            log.info("%s%s", verdict.summary(), f"; remembered in {cache_path()}" if use_cache else "")
            if use_cache:
                _remember(cache_path(), key, verdict)
        return True
    if mode == "error":
        raise _group_failure(failure, failed)
    if failure is not None:
        log.warning("%s\nnorm.cuda_selfcheck=fallback: training with torch's nn.SyncBatchNorm instead.", failure)
    else:
        where = f"rank{'s' if len(failed) > 1 else ''} {', '.join(map(str, failed))}"
        log.warning("SyncBN CUDA self-check failed on %s; norm.cuda_selfcheck=fallback: every rank trains with "
                    "torch's nn.SyncBatchNorm instead.", where)
    return False


# --- Library use: this process alone, at the layer's first CUDA training forward ------------------------

FIRST_USE_ENV = "SYNCTRAIN_SYNCBN_SELFCHECK"  # error (default) | warn | off: the layers' own first-use check
_CHECKED: set[str] = set()  # CUDA devices this process has checked (here, or through the trainer's gate)


def _cuda_device(device: torch.device | str) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def check(device: torch.device | str = "cuda", *, ops: ModuleType | None = None, use_cache: bool = True,
          group: str | None = None, cases: tuple[sc.Case, ...] | None = None,
          dtypes: tuple[torch.dtype, ...] = sc.DTYPES) -> SelfCheckReport | None:
    """Self-check our kernels on `device`: the report of a check run now, None when a pass for this GPU,
    driver and build is remembered; SelfCheckError when they disagree with the references (or raise). For
    users of src.syncbn outside the trainer who want the check at a moment of their choosing, e.g. before
    compiling a model (the layers' own first-use check runs in eager forwards only).

    group: None, this process alone (no collective); or the name of a process group (collectives.resolve_group)
    whose every rank calls this at the same point: they agree through one all_reduce of the verdict, so when
    any rank failed every rank raises (naming the failing ranks) and none is left waiting in the layer's
    next collective; a pass is remembered only when every rank of the group had it. cases, dtypes: as
    run_selfcheck (default: every case for this device, every dtype).
    """
    device = _cuda_device(device)
    if ops is None:  # the kernels the layers use (loaded now if no layer has run yet)
        from .functions import kernel_ops

        ops = kernel_ops().module
    build = Path(getattr(ops, "__file__", "") or "unknown").stem
    key = device_key(device, build) if device.type == "cuda" else f"{device} | {build}"
    _CHECKED.add(str(device))
    verdict = _check_or_recall(ops, device, key, use_cache, cases, dtypes)
    failure = verdict if isinstance(verdict, SelfCheckError) else None
    if group is None:
        if failure is not None:
            raise failure
    else:
        failed = _failed_ranks(failure is not None, device, group)
        if failed:
            raise _group_failure(failure, failed)
    if isinstance(verdict, SelfCheckReport):
        log.info("%s", verdict.summary())
        if use_cache:
            _remember(cache_path(), key, verdict)
    return verdict


def check_first_use(device: torch.device, process_group: Any = None, group_size: int | None = None) -> None:
    """What SyncBatchNorm runs at its first training forward on each CUDA device of this process (eager mode):
    `check(device)` unless this process checked it already (the trainer's gate counts), agreed on the
    layer's group (process_group and group_size as the layer has them: every rank of it reaches this in the
    same forward) with one all_reduce of the verdict, so that all of them raise or go on together.
    SYNCTRAIN_SYNCBN_SELFCHECK (the same on every rank): error (default: a disagreement raises
    SelfCheckError), warn (log it and go on), off (no check, no collective)."""
    if str(device) in _CHECKED:
        return
    mode = os.environ.get(FIRST_USE_ENV, "error")
    if mode not in ("error", "warn", "off"):
        raise ValueError(f"{FIRST_USE_ENV}={mode!r}: expected error, warn or off")
    _CHECKED.add(str(device))
    if mode == "off":
        return
    from .collectives import resolve_group

    name, size = resolve_group(process_group, group_size)
    try:
        check(device, group=name if size > 1 else None)
    except SelfCheckError as err:
        if mode == "error":
            raise
        log.warning("%s\n%s=warn: going on with our CUDA kernels anyway.", err, FIRST_USE_ENV)


def ensure_cuda_kernels_checked(device: torch.device | str, mode: str = "error", *,
                                ops: ModuleType | None = None, use_cache: bool = True) -> bool:
    """Self-check our kernels on `device` once per (GPU, driver, build); True when they may be used.

    mode "error": a disagreement on any rank raises SelfCheckError on every rank; "fallback": every rank
    logs a warning and returns False (the caller switches to nn.SyncBatchNorm); "off": no check, True.
    Not a CUDA device: nothing to check, True. See agree_on_selfcheck.
    """
    check_mode(mode)
    device = torch.device(device)
    if mode == "off" or device.type != "cuda":
        return True
    device = _cuda_device(device)
    _CHECKED.add(str(device))  # decided here for every rank: the layers' first-use check stays out of the way
    if ops is None:
        from .extension import load_extension

        ops = load_extension()
    build = Path(getattr(ops, "__file__", "") or "unknown").stem
    return agree_on_selfcheck(ops, device, mode, device_key(device, build), use_cache=use_cache)


def main(argv: list[str] | None = None) -> int:
    """`python -m src.syncbn.selfcheck [--json OUT] [--quick]`: check cuda:0 now (no memory), print the result."""
    import argparse

    parser = argparse.ArgumentParser(description="Self-check our SyncBN CUDA kernels on cuda:0 against PyTorch's.")
    parser.add_argument("--json", type=Path, help="write the result here")
    parser.add_argument("--quick", action="store_true",
                        help="every case in float32 and bfloat16, one pass (for compute-sanitizer, which is slow)")
    parser.add_argument("--sanitizer", action="store_true",
                        help="make every input of our kernels on the CPU and copy it (compute-sanitizer's initcheck)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("selfcheck: no CUDA GPU visible (torch.cuda.is_available() is False); nothing to check")
        return 2
    from .extension import load_extension

    device = torch.device("cuda", 0)
    ops = load_extension()
    key = device_key(device, Path(getattr(ops, "__file__", "") or "unknown").stem)
    dtypes = (torch.float32, torch.bfloat16) if args.quick else sc.DTYPES
    result: dict[str, Any] = {"device": key}
    try:  # first run as a training process meets it (cold: module load, allocator), then warm (not --quick)
        cold = run_selfcheck(ops, device, device_name=key, dtypes=dtypes, staged=args.sanitizer)
        report = cold if args.quick else run_selfcheck(ops, device, device_name=key, dtypes=dtypes,
                                                       staged=args.sanitizer)
    except SelfCheckError as err:
        result.update(passed=False, error=str(err))
    else:
        result.update(passed=True, summary=report.summary(), seconds_cold=cold.seconds, seconds=report.seconds,
                      comparisons=report.comparisons, cases=report.cases, reference_unavailable=report.unavailable)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(result.get("summary") or result["error"])
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
