"""How exact SyncBN's exchange is: the merged mean and variance against exact rational arithmetic.

    python scripts/bench_exchange_accuracy.py [--json OUT.json] [--per-rank 256]

For W = 2, 3 and 4 ranks whose batches have means of alternating sign (+m, -m, +m, ...; uneven counts, so the
global mean is not 0) or all of one sign (+m: |mean| >> std), float32 and float64 input, std 1 within each rank:
every rank's [n, mean, M2] comes from the SyncBN kernel (batch_norm_stats), and the two all_reduces are computed
as the layer chains them (batch_norm_mean_sums, then batch_norm_deviation_sums on the summed first payload), the
collective's float64 sum of the W payloads taken in *every* order and association of the W terms (whatever gloo's
ring or NCCL's tree does), the worst kept. Two exact references (Python fractions): the exact Chan merge of the
ranks' float64 rows ("exchange alone": what the two all_reduces add) and the exact mean and variance of the input
values ("end to end": the per-rank kernels too). Reported, worst over W and m: the merged mean's error relative to
the global std and to |mean| + std, the variance's relative error, and, for scale, torch.var_mean of the
concatenated batch in the input's dtype. Prints a Markdown table, writes every case to the JSON. Under a minute.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# (input dtype, all rank means of one sign) -> the m tried. Rank means of one sign with std 1 go only as far as the
# dtype keeps a spread (float32 at 1e4 holds 10 bits of it); alternating signs make the spread itself m.
MEANS = {(torch.float64, False): (1.0, 1e4, 1e8, 1e12, 1e15, 1e100), (torch.float64, True): (1.0, 1e4, 1e8, 1e12),
         (torch.float32, False): (1.0, 1e4, 1e8, 1e15, 1e30), (torch.float32, True): (1.0, 1e2, 1e4)}
CHANNELS = 2


def sums_every_way(terms: list[torch.Tensor]) -> Iterator[torch.Tensor]:
    """The float64 sums of the tensors in every order and association (every binary tree over them), each once."""
    def trees(items: list[torch.Tensor]) -> Iterator[torch.Tensor]:
        if len(items) == 1:
            yield items[0]
            return
        for split in range(1, len(items)):
            for left in trees(items[:split]):
                for right in trees(items[split:]):
                    yield left + right
    seen = set()
    for order in itertools.permutations(terms):
        for total in trees(list(order)):
            key = tuple(total.tolist())  # many orders round alike: each distinct result once
            if key not in seen:
                seen.add(key)
                yield total


def exact_moments(values: list[float]) -> tuple[Fraction, Fraction]:
    """The exact mean and biased variance of float values."""
    xs = [Fraction(v) for v in values]
    mean = sum(xs) / len(xs)
    return mean, sum((x - mean) ** 2 for x in xs) / len(xs)


def case_data(world: int, m: float, same_sign: bool, dtype: torch.dtype, per_rank: int,
              seed: int) -> list[torch.Tensor]:
    """Each rank's (n_r, CHANNELS) batch: mean +-m (alternating unless same_sign), std 1, n_r = per_rank + 17 r."""
    gen = torch.Generator().manual_seed(seed)
    return [((m if same_sign or r % 2 == 0 else -m)
             + torch.randn(per_rank + 17 * r, CHANNELS, generator=gen, dtype=torch.float64)).to(dtype)
            for r in range(world)]


def merged_rows(local: list[torch.Tensor]) -> list[tuple[Fraction, Fraction]]:
    """The exact Chan merge of the ranks' float64 [n, mean, M2] rows: per channel the mean and biased variance."""
    channels = (local[0].numel() - 1) // 2
    rows = [[Fraction(v) for v in s.tolist()] for s in local]
    n = sum(r[0] for r in rows)
    out = []
    for c in range(channels):
        mean = sum(r[0] * r[1 + c] for r in rows) / n
        m2 = sum(r[1 + channels + c] + r[0] * (r[1 + c] - mean) ** 2 for r in rows)
        out.append((mean, m2 / n))
    return out


def exchange_worst(ops: Any, batches: list[torch.Tensor], exact: list[tuple[Fraction, Fraction]]) -> dict[str, float]:
    """Worst errors over the sums' orders: against the exact merge of the ranks' rows (the exchange alone) and
    against the exact statistics of the values (the per-rank kernels too)."""
    local = [ops.batch_norm_stats(x) for x in batches]
    rows = merged_rows(local)
    alone, end_to_end = [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]
    for sums in sums_every_way([ops.batch_norm_mean_sums(s) for s in local]):
        deviations = [ops.batch_norm_deviation_sums(s, sums) for s in local]
        n = sums[0]
        for m2 in sums_every_way(deviations):
            _update(alone, sums[1:] / n, m2 / n, rows)
            _update(end_to_end, sums[1:] / n, m2 / n, exact)
    return {"exchange_mean_err_per_std": alone[0], "exchange_mean_err_per_mean_plus_std": alone[1],
            "exchange_var_rel_err": alone[2], "mean_err_per_std": end_to_end[0],
            "mean_err_per_mean_plus_std": end_to_end[1], "var_rel_err": end_to_end[2]}


def _update(worst: list[float], mean: torch.Tensor, var: torch.Tensor, exact: list[tuple[Fraction, Fraction]]) -> None:
    """Raise `worst` ([mean error / std, mean error / (|mean| + std), variance relative error]) to these values'."""
    for c, (mu, var_exact) in enumerate(exact):
        std = math.sqrt(float(var_exact))
        err = _error(float(mean[c]), mu)
        worst[0] = max(worst[0], err / std)
        worst[1] = max(worst[1], err / (abs(float(mu)) + std))
        worst[2] = max(worst[2], _error(float(var[c]), var_exact) / float(var_exact))


def _error(value: float, exact: Fraction) -> float:
    """|value - exact| (inf for a value that is not finite: torch's float32 variance overflows at 1e30)."""
    return abs(float(Fraction(value) - exact)) if math.isfinite(value) else math.inf


def torch_reference(batches: list[torch.Tensor], exact: list[tuple[Fraction, Fraction]]) -> dict[str, float]:
    """The same errors for torch.var_mean of the concatenated batch, in float64 and in the input's dtype."""
    out = {}
    for label, dtype in (("torch64", torch.float64), ("torch_input_dtype", batches[0].dtype)):
        var, mean = torch.var_mean(torch.cat(batches).to(dtype), dim=0, correction=0)
        worst = [0.0, 0.0, 0.0]
        _update(worst, mean.double(), var.double(), exact)
        out.update({f"{label}_mean_err_per_std": worst[0], f"{label}_var_rel_err": worst[2]})
    return out


def measure(per_rank: int, kernel_ops: Callable[[], Any]) -> list[dict[str, Any]]:
    """Every case's worst errors (see the module docstring)."""
    ops = kernel_ops()
    rows = []
    for (dtype, same_sign), means in MEANS.items():
        for world in (2, 3, 4):
            for i, m in enumerate(means):
                batches = case_data(world, m, same_sign, dtype, per_rank, seed=1000 * world + i)
                values = torch.cat(batches).double()
                exact = [exact_moments(values[:, c].tolist()) for c in range(CHANNELS)]
                rows.append({"dtype": str(dtype).replace("torch.", ""), "W": world,
                             "rank means": "+m all" if same_sign else "+m, -m, ...", "m": m,
                             **exchange_worst(ops, batches, exact), **torch_reference(batches, exact)})
    return rows


COLUMNS = {  # JSON key -> table heading; each the worst over W = 2-4 and the m of the row
    "exchange_mean_err_per_std": "exchange alone: mean error / std",
    "exchange_mean_err_per_mean_plus_std": "exchange alone: mean error / (abs(mean) + std)",
    "exchange_var_rel_err": "exchange alone: variance rel. error",
    "mean_err_per_std": "end to end: mean error / std",
    "var_rel_err": "end to end: variance rel. error",
    "torch_input_dtype_mean_err_per_std": "torch.var_mean, input dtype: mean error / std",
    "torch_input_dtype_var_rel_err": "torch.var_mean, input dtype: variance rel. error",
}


def table(rows: list[dict[str, Any]]) -> str:
    """One line per input dtype and sign pattern: the worst over W = 2-4 and m."""
    out = ["| input | rank means | m | " + " | ".join(COLUMNS.values()) + " |", "|---" * (3 + len(COLUMNS)) + "|"]
    for dtype in ("float32", "float64"):
        for signs in ("+m, -m, ...", "+m all"):
            group = [r for r in rows if r["dtype"] == dtype and r["rank means"] == signs]
            ms = sorted({r["m"] for r in group})
            cells = [f"{max(r[key] for r in group):.1e}" for key in COLUMNS]
            out.append(f"| {dtype} | {signs} | {ms[0]:.0e} to {ms[-1]:.0e} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Measure, print the table, write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--per-rank", type=int, default=256, help="values per channel on rank 0 (rank r: + 17 r)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    from src.syncbn.functions import kernel_ops

    rows = measure(args.per_rank, kernel_ops)
    print(table(rows))
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
