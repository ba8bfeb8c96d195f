"""report.json of one `make gpu-check` run (scripts/gpu_check.sh calls this from its exit trap).

    python scripts/gpu_check_report.py OUTDIR SECONDS BUDGET_S COMPLETE(0|1) STEP[,STEP...]

Reads OUTDIR/steps.tsv (name, status, rc, seconds, cap, note per finished step; status is passed, failed,
skipped or timed out) and attaches each step's own JSON written in this run (the script deletes earlier
runs' files before it starts, so nothing old is merged). Planned steps with no row were not reached: the
run stopped first (killed, or an early stop); they are listed as skipped with that reason and `complete`
is false. A training compare that ran one process (one GPU: no NCCL collective) is marked partial.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ATTACHED = {"selfcheck": "selfcheck.json", "train_compare": "train_compare/train_compare.json",
            "bench": "bench_syncbn_cuda.json", "occupancy": "occupancy.json", "preflight": "preflight.json"}
BAD = ("failed", "timed out")


def read_steps(out: Path) -> list[dict]:
    """The rows of steps.tsv as report entries, with the steps' JSON results attached."""
    tsv = out / "steps.tsv"
    steps = []
    for line in (tsv.read_text().splitlines() if tsv.is_file() else []):
        name, status, rc, seconds, cap, note = (line.split("\t") + [""] * 6)[:6]
        entry: dict = {"step": name, "status": status, "rc": None if rc in ("-", "") else int(rc),
                       "seconds": int(seconds or 0), "cap_s": int(cap or 0)}
        if note:
            entry["note"] = note
        path = out / ATTACHED.get(name, "-")
        if path.is_file():
            try:
                entry["result"] = json.loads(path.read_text())
            except ValueError:
                entry["result"] = f"unreadable: {path}"
        if name == "train_compare" and isinstance(entry.get("result"), dict) and entry["result"].get("nproc", 2) < 2:
            entry["partial"] = True  # one process: the kernels ran, but no NCCL collective was compared
            entry["note"] = (note + "; " if note else "") + "partial: one GPU, one process, no NCCL collective"
        steps.append(entry)
    return steps


def main(argv: list[str]) -> int:
    """Write OUTDIR/report.json and print a summary table."""
    out, total, budget, complete = Path(argv[0]), int(argv[1]), int(argv[2]), argv[3] == "1"
    planned = [s for s in argv[4].split(",") if s] if len(argv) > 4 else []
    steps = read_steps(out)
    seen = {s["step"] for s in steps}
    for name in planned:
        if name not in seen:
            steps.append({"step": name, "status": "skipped", "rc": None, "seconds": 0,
                          "note": "not reached: the run stopped before this step"})
            complete = False
    env = (out / "env.txt").read_text(errors="replace").splitlines()[:16] if (out / "env.txt").is_file() else []
    report = {"complete": complete, "passed": complete and not any(s["status"] in BAD for s in steps),
              "seconds": total, "budget_s": budget, "steps": steps, "env": env}
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    counts = {k: sum(s["status"] == k for s in steps) for k in ("passed", "failed", "timed out", "skipped")}
    print(f"gpu_check: {'complete' if complete else 'INCOMPLETE'}; " + ", ".join(f"{v} {k}" for k, v in counts.items())
          + f" in {total}s -> {out / 'report.json'}")
    for s in steps:
        print(f"  {s['step']:<22} {s['status']:<10} {s['seconds']:>4}s {s.get('note', '')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
