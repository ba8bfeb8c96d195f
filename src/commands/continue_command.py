"""The command that continues a run, as the user launched it: `python train.py`, `torchrun [its options] train.py`
or `make train NPROC=N`, followed by `trainer.resume=<run folder>` (a resume needs nothing else).

How it was launched is read from the process: torchrun's workers have TORCHELASTIC_RUN_ID and their parent is the
torchrun agent, whose command line gives its options; the Makefile's train recipe sets MAKE_TARGET_ENV (not make's
own MAKELEVEL, which every recipe's commands inherit: `make test` running torchrun is not `make train`).
"""
from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Optional

from src.commands.run_dir import shown_path

_TORCHRUN_MODULE = "torch.distributed.run"
MAKE_TARGET_ENV = "SYNCTRAIN_MAKE_TARGET"  # set by the Makefile's train recipe to "train"


def continue_command(run_dir: Path) -> str:
    """The shell command that continues the run in `run_dir`, launched the way this process was."""
    resume = shlex.quote(f"trainer.resume={shown_path(run_dir)}")
    script = shown_path(Path(sys.argv[0])) if sys.argv and sys.argv[0] else "train.py"
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return f"{_python()} {shlex.quote(script)} {resume}"
    nproc = os.environ.get("LOCAL_WORLD_SIZE", "1")
    if os.environ.get(MAKE_TARGET_ENV) == "train":  # `make train` (its recipe runs torchrun --nproc_per_node=$(NPROC))
        return f'make train NPROC={nproc} ARGS="{resume}"'
    launcher = _torchrun_launcher(_parent_argv(), sys.argv[0]) or ["torchrun", f"--nproc_per_node={nproc}"]
    return " ".join([*map(shlex.quote, launcher), shlex.quote(script), resume])


def _torchrun_launcher(agent: Optional[list[str]], script: str) -> Optional[list[str]]:
    """`torchrun <options>` (or `python -m torch.distributed.run <options>`) from the agent's command line."""
    if not agent or script not in agent:
        return None
    end = agent.index(script)
    for i, arg in enumerate(agent[:end]):
        if Path(arg).name == "torchrun":
            entry = "torchrun" if _same_file(shutil.which("torchrun"), arg) else arg
            return [entry, *agent[i + 1:end]]
        if arg == "-m" and i + 1 < end and agent[i + 1] == _TORCHRUN_MODULE:
            return [_python(), "-m", _TORCHRUN_MODULE, *agent[i + 2:end]]
    return None


def _parent_argv() -> Optional[list[str]]:
    try:
        raw = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _python() -> str:
    """`python` when that is this interpreter on PATH (an activated environment), else its full path."""
    return "python" if _same_file(shutil.which("python"), sys.executable) else sys.executable


def _same_file(a: Optional[str], b: Optional[str]) -> bool:
    return bool(a and b) and os.path.realpath(a) == os.path.realpath(b)
