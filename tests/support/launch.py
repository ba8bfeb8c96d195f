"""Running train.py / evaluate.py / predict.py as users do: real (torchrun) processes from the repository root."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 420

# 192 training images of 16x16, global batch 16: 12 optimizer steps per epoch; 101 validation images
# (prime: no world size divides it). One thread per process: the CI machine has 2 cores.
TINY = [
    "data.train_size=192", "data.val_size=101", "data.image_size=16", "data.eval_batch_size=64",
    "device=cpu", "seed=3", "trainer.num_threads=1", "trainer.progress_bar=false",
]


def _env(full_error: bool = True) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                                             "MASTER_ADDR", "MASTER_PORT", "HYDRA_FULL_ERROR"}}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **({"HYDRA_FULL_ERROR": "1"} if full_error else {}))
    return env


def launch(nproc: int, overrides: list[str], timeout: float = TIMEOUT_S, script: str = "train.py",
           cwd: Path = REPO, *, full_error: bool = True, torchrun_args: tuple[str, ...] = ()
           ) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc_per_node=nproc script overrides` (plain `python script` for 0), in `cwd`.

    full_error: HYDRA_FULL_ERROR=1, so that any failure shows its traceback (a user's mistake too); False runs as
    users do, where a mistake is one message. torchrun_args: more of torchrun's own options.
    """
    script_path = str(REPO / script)
    if nproc == 0:
        argv = [sys.executable, script_path, *overrides]
    else:
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                *torchrun_args, script_path, *overrides]
    # Own session, so a timeout kills exactly this job's processes (agent and workers).
    proc = subprocess.Popen(argv, cwd=cwd, env=_env(full_error), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(argv)} did not finish in {timeout}s:\n{out[-4000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, None)


def rows(run_dir: Path, split: str) -> list[dict]:
    """The rows of `split` ("train" or "val") in the run's metrics.jsonl, in order."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == split]
