"""The summary a finished training run ends with: wall time, steps, the best metric and its checkpoint, the last
metric, and the commands that evaluate, predict with and export this run.

Read from the run folder (metrics.jsonl, checkpoints/) once training is over, so it says what a later reader of
the folder finds; printed by rank 0 (and written to its log file). The commands are ready to paste: the
interpreter and torchrun as this process was started (`python` when that is the one on PATH, else its path),
the entry points next to train.py, the run's own checkpoint; predict.py's input is the one thing to fill in.
"""
from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from src.engine.checkpoint.files import LAST_NAME, checkpoint_dir
from src.logger import write_to_log_files
from src.tasks import Task

REPO = Path(__file__).resolve().parents[2]  # where train.py and the other entry points are
IMAGES = "YOUR_IMAGES"  # predict.py's input: an image file or a folder of them


@dataclass
class RunSummary:
    """What a finished run's folder says about it."""

    run_dir: Path
    wall_s: Optional[float]  # this process's wall time (None where the system does not tell)
    steps: int  # optimizer steps done
    epochs: int  # epochs begun (metrics.jsonl's `epoch` of its last row, plus one)
    metric: str  # the metric best-k checkpoints are ranked by
    best: Optional[tuple[float, int]]  # its best value and the step it was reached at
    best_checkpoint: Optional[Path]  # that evaluation's best_*.pt (None with trainer.keep_best=0)
    last: Optional[tuple[float, int]]  # its value at the final evaluation, and that step


def print_run_summary(run_dir: Path, task: Task, metric: str) -> None:
    """On rank 0: print the finished run's summary (see the module docstring) and write it to the log file."""
    if os.environ.get("RANK", "0") != "0":
        return
    text = format_summary(read_summary(run_dir, task, metric), task, launched_workers())
    print(text, flush=True)
    write_to_log_files(text)


def read_summary(run_dir: Path, task: Task, metric: str, wall_s: Optional[float] = None) -> RunSummary:
    """The summary of the run in `run_dir` ranked by `metric` (its direction is the task's); wall_s: this
    process's wall time unless given."""
    rows = _rows(Path(run_dir) / "metrics.jsonl")
    scored = [(float(r[metric]), int(r["step"])) for r in rows if r.get("split") == "val" and _finite(r.get(metric))]
    higher = task.higher_is_better(metric)
    # The first evaluation that reached the best value: the one best-k keeps (a tie does not replace it).
    best = max(scored, key=lambda vs: (vs[0] if higher else -vs[0], -vs[1])) if scored else None
    found = sorted(checkpoint_dir(run_dir).glob(f"best_step{best[1]:07d}_{metric}*.pt")) if best else []
    last_row = rows[-1] if rows else {}
    return RunSummary(run_dir=Path(run_dir), wall_s=_process_wall_s() if wall_s is None else wall_s,
                      steps=int(last_row.get("step", 0)), epochs=int(last_row.get("epoch", -1)) + 1, metric=metric,
                      best=best, best_checkpoint=found[0] if found else None, last=scored[-1] if scored else None)


def format_summary(summary: RunSummary, task: Task, workers: int = 1) -> str:
    """The summary's lines; `workers`: the processes per node this run had (torchrun's evaluate command)."""
    run_dir = summary.run_dir
    wall = f" in {_duration(summary.wall_s)}" if summary.wall_s is not None else ""
    steps = f"{summary.steps} optimizer step{'' if summary.steps == 1 else 's'}"
    lines = [f"run finished{wall}: {steps}, {summary.epochs} epoch(s); run folder {_shown(run_dir)}"]
    last_pt = checkpoint_dir(run_dir) / LAST_NAME
    if summary.best is not None:
        value, step = summary.best
        where = (_shown(summary.best_checkpoint) if summary.best_checkpoint is not None
                 else "no best_*.pt kept (trainer.keep_best=0)")
        lines.append(f"  best {summary.metric} {value:.4g} at step {step}: {where}")
    if summary.last is not None:
        value, step = summary.last
        lines.append(f"  last {summary.metric} {value:.4g} at step {step}: {_shown(last_pt)}")
    ckpt = summary.best_checkpoint or last_pt
    if not ckpt.is_file():
        return "\n".join(lines)
    python, scripts = _command("python"), _shown(REPO)
    script = (lambda name: name) if scripts == "." else (lambda name: shlex.quote(str(Path(scripts) / name)))
    ckpt_arg = shlex.quote(f"ckpt={_shown(ckpt)}")
    evaluate = (f"{_command('torchrun')} --standalone --nproc_per_node={workers}" if workers > 1 else python)
    lines.append(f"  evaluate: {evaluate} {script('evaluate.py')} {ckpt_arg}")
    if type(task).predict is not Task.predict:  # the task writes predictions
        out = shlex.quote(f"out={_shown(run_dir / 'predictions')}")
        lines.append(f"  predict:  {python} {script('predict.py')} {ckpt_arg} input={IMAGES} {out}")
    if task.exportable:
        out = shlex.quote(f"out={_shown(run_dir / 'model.onnx')}")
        lines.append(f"  export:   {python} {script('export.py')} {ckpt_arg} format=onnx {out}")
    return "\n".join(lines)


def launched_workers() -> int:
    """The processes per node of this launch (torchrun's LOCAL_WORLD_SIZE; 1 without torchrun)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def _rows(path: Path) -> list[dict[str, Any]]:
    """metrics.jsonl's rows (none when it is absent; a torn last line is skipped)."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _shown(path: Path) -> str:
    """`path` relative to the working folder when it lies below it (shorter, and what the user typed), else
    absolute; symbolic links are kept (a virtual environment's python is one, to the interpreter without it)."""
    path = Path(os.path.abspath(path))
    try:
        return str(path.relative_to(os.path.abspath(Path.cwd()))) or "."
    except ValueError:
        return str(path)


def _command(name: str) -> str:
    """`python` / `torchrun` when the one on PATH is this process's environment's, else its path (torchrun:
    `<python> -m torch.distributed.run` where the environment has no torchrun script)."""
    own = Path(sys.executable).parent / name
    on_path = shutil.which(name)
    if on_path is not None and own.exists() and Path(on_path).resolve() == own.resolve():
        return name
    if own.exists():
        return shlex.quote(_shown(own))
    return shlex.quote(sys.executable) + ("" if name == "python" else " -m torch.distributed.run")


def _duration(seconds: float) -> str:
    """4 min 32 s, 1 h 02 min, 9 s."""
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
    return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"


def _process_wall_s() -> Optional[float]:
    """Seconds since this process started (Linux: /proc), None elsewhere."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # starttime, field 22, in clock ticks after boot
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, uptime - started)

