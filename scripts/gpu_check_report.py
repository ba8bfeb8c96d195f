"""report.json of one `make gpu-check` run (scripts/gpu_check.sh calls this after every step and from its exit
trap).

    python scripts/gpu_check_report.py WORK OUTDIR SECONDS BUDGET_S COMPLETE(0|1) STEP[,STEP...] [REASON] [RUNNING]

Reads WORK/steps.tsv (name, status, rc, seconds, cap, note per finished step; status is passed, failed,
skipped or timed out) and attaches each step's own JSON written in this run (WORK is the run's own scratch
folder, so nothing old is merged). Planned steps with no row were not reached: the run stopped first
(killed, out of budget, or an early stop); they are listed as skipped with that reason and `complete` is
false. RUNNING names the step in progress when the report is written between steps (a run killed
without a chance to write again leaves that report). A training compare that ran one process (one GPU: no
NCCL collective) is marked partial. Writes OUTDIR/report.json and prints a summary table.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ATTACHED = {"selfcheck": "selfcheck.json", "occupancy": "occupancy.json", "exchange_host": "exchange_host.json",
            "train_compare": "train_compare/train_compare.json", "bench": "bench_syncbn_cuda.json",
            "bench_loader": "bench_loader.json"}
BAD = ("failed", "timed out")


def read_steps(work: Path) -> list[dict]:
    """The rows of steps.tsv as report entries, with the steps' JSON results attached."""
    tsv = work / "steps.tsv"
    steps = []
    for line in (tsv.read_text().splitlines() if tsv.is_file() else []):
        name, status, rc, seconds, cap, note = (line.split("\t") + [""] * 6)[:6]
        entry: dict = {"step": name, "status": status, "rc": None if rc in ("-", "") else int(rc),
                       "seconds": int(seconds or 0), "cap_s": int(cap or 0)}
        if note:
            entry["note"] = note
        path = work / ATTACHED.get(name, "-")
        if path.is_file():
            try:
                entry["result"] = json.loads(path.read_text())
            except ValueError:
                entry["result"] = f"unreadable: {path.name}"
        if name == "train_compare" and isinstance(entry.get("result"), dict) and entry["result"].get("nproc", 2) < 2:
            entry["partial"] = True  # one process: the kernels ran, but no NCCL collective was compared
            entry["note"] = (note + "; " if note else "") + "partial: one GPU, one process, no NCCL collective"
        steps.append(entry)
    return steps


def main(argv: list[str]) -> int:
    """Write OUTDIR/report.json and print a summary table."""
    work, out, total, budget, complete = Path(argv[0]), Path(argv[1]), int(argv[2]), int(argv[3]), argv[4] == "1"
    planned = [s for s in argv[5].split(",") if s] if len(argv) > 5 else []
    reason = argv[6] if len(argv) > 6 else ""
    running = argv[7] if len(argv) > 7 else ""
    steps = read_steps(work)
    seen = {s["step"] for s in steps}
    for name in planned:
        if name not in seen:
            note = ("running when this report was written (a later report would have replaced this one: the run "
                    "was killed outright during this step)" if name == running
                    else "not reached: the run stopped before this step")
            steps.append({"step": name, "status": "skipped", "rc": None, "seconds": 0, "note": note})
            complete = False
    env = (work / "env.txt").read_text(errors="replace").splitlines()[:24] if (work / "env.txt").is_file() else []
    report = {"complete": complete, "passed": complete and not any(s["status"] in BAD for s in steps),
              "seconds": total, "budget_s": budget, "steps": steps, "env": env}
    if reason and not complete:
        report["reason"] = reason
    if running:
        report["running"] = running
    tmp = out / "report.json.tmp"
    tmp.write_text(json.dumps(report, indent=1) + "\n")
    os.replace(tmp, out / "report.json")  # a reader (or a kill) never meets half a file
    counts = {k: sum(s["status"] == k for s in steps) for k in ("passed", "failed", "timed out", "skipped")}
    print(f"gpu_check: {'complete' if complete else 'INCOMPLETE'}; " + ", ".join(f"{v} {k}" for k, v in counts.items())
          + f" in {total}s of {budget}s -> {out / 'report.json'}" + (f"; {reason}" if reason and not complete else ""))
    for s in steps:
        print(f"  {s['step']:<22} {s['status']:<10} {s['seconds']:>4}s {s.get('note', '')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
