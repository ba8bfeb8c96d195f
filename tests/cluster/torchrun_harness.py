"""Launch real torchrun jobs of train.py on this machine and watch, stall or kill their workers.

Everything here drives real processes (torchrun agents, gloo over loopback): no distributed mock.
Each job runs in its own session so that cleanup can kill exactly the processes a test started, by
process group, and never anything else on the machine.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
TRAIN = str(REPO / "train.py")
LAUNCHER = REPO / "scripts" / "launch_multinode.sh"

# SyncBN (ours) is what runs across processes and nodes in the product, so it is what the cluster
# tests run. SYNCTRAIN_CLUSTER_TEST_NORM=bn runs them without the compiled kernels (a quick check of
# the launch/resume machinery while the kernels are being rebuilt).
NORM = os.environ.get("SYNCTRAIN_CLUSTER_TEST_NORM", "syncbn")

# The smallest job that still exercises everything the cluster tests care about: SyncBN across
# processes, several epochs with mid-epoch checkpoints, evaluation. 256 images / (2 ranks x 16) = 8
# optimizer steps per epoch; one process thread each, so two workers fit the 2-core CI machine.
# float64 (trainer.dtype): a resumed, restarted, requeued or two-node run is compared with one
# uninterrupted run to 1e-9, where float32's rounding could neither hide nor fake a difference.
TINY_JOB = [
    "model=resnet20", f"norm={NORM}", "data=shapes",
    "data.train_size=256", "data.val_size=64", "data.image_size=16",
    "data.batch_size=16", "data.eval_batch_size=64", "data.num_workers=0",
    "device=cpu", "seed=0", "trainer.dtype=float64",
    "trainer.deterministic=true", "trainer.num_threads=1", "trainer.log_every=1",
    "trainer.progress_bar=false", "trainer.tensorboard=false",
]


# Tolerances of every comparison with the uninterrupted reference run. Both runs do the same float64
# arithmetic on this machine (same world size, batches, thread count; a resume restores every tensor,
# RNG state and the sampler position), so they agree to the last bits; 1e-9 (relative for losses,
# absolute for parameters and BN statistics of order 1-10) only admits rounding noise of order 1e-15.
# A skipped or repeated batch, a restarted schedule or momentum, a rank with the wrong seed or a
# missing gradient sync moves them by more than 1e-4.
LOSS_RTOL = 1e-9
PARAM_ATOL = 1e-9


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_env(**extra: str) -> dict[str, str]:
    """Environment for a launched job: this one without any torchrun/SLURM variables of the caller."""
    env = {k: v for k, v in os.environ.items()
           if k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                        "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"} and not k.startswith("SLURM_")}
    # LOGLEVEL=INFO: torchrun's agent logs rendezvous results and restarts, which a failing test prints.
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", HYDRA_FULL_ERROR="1", LOGLEVEL="INFO")
    env.update(extra)
    return env


class Job:
    """One launched command (a torchrun agent, or a launcher script that execs one)."""

    def __init__(self, argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self._log = open(log_path, "wb")
        # Own session: the agent, its workers and anything they start share one process group.
        self.proc = subprocess.Popen(self.argv, cwd=REPO, env=env or job_env(), stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.pid = self.proc.pid

    def output(self, since: int = 0) -> str:
        """Everything the job printed (stdout and stderr), from byte offset `since`."""
        with open(self.log_path, "rb") as f:
            f.seek(since)
            return f.read().decode(errors="replace")

    def output_size(self) -> int:
        """Bytes printed so far (an offset for output(since=...))."""
        return self.log_path.stat().st_size

    def wait(self, timeout: float) -> int:
        """Exit status; on timeout the whole job is killed and the test fails with its output."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.argv[:3]}... did not finish within {timeout:.0f} s; output:\n"
                                 + self.output()[-6000:]) from None

    def running(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the job's process group (SIGCONT first, so stopped workers die too)."""
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        self._log.close()


def launch_torchrun(torchrun_args: Sequence[str], overrides: Sequence[str], log_path: Path,
                    env: dict[str, str] | None = None) -> Job:
    """Start `torchrun <torchrun_args> train.py <overrides>`."""
    return Job([TORCHRUN, *torchrun_args, TRAIN, *overrides], log_path, env)


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state letter) of a live process, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2:].split()  # the command name may contain spaces
    return int(fields[1]), fields[0]


def is_alive(pid: int) -> bool:
    """True while `pid` runs (or is stopped); False once it exited, zombies included."""
    st = _stat(pid)
    return st is not None and st[1] not in ("Z", "X")


def worker_pids(agent_pid: int) -> dict[int, int]:
    """Global rank -> pid of the live train.py workers that torchrun agent `agent_pid` started."""
    workers: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        st = _stat(pid)
        if st is None or st[0] != agent_pid or st[1] in ("Z", "X"):
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue
        for item in environ:
            if item.startswith(b"RANK="):
                workers[int(item[5:])] = pid
    return workers


def wait_until(condition: Callable[[], bool], timeout: float, what: str, job: Job | None = None,
               poll: float = 0.05) -> None:
    """Poll `condition` until true; fail (with the job's output) on timeout or when the job ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        if job is not None and not job.running():
            raise AssertionError(f"the job ended (exit {job.proc.returncode}) before {what}; output:\n"
                                 + job.output()[-6000:])
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}"
                         + ("" if job is None else "; output:\n" + job.output()[-6000:]))


def last_checkpoint_file(run_dir: Path) -> Path | None:
    """The run's last checkpoint (its name contains "last"; temporary files start with a dot)."""
    found = [p for p in run_dir.rglob("*last*") if p.is_file() and not p.name.startswith(".")]
    assert len(found) <= 1, f"more than one 'last' checkpoint in {run_dir}: {found}"
    return found[0] if found else None


def load_last_checkpoint(run_dir: Path) -> dict:
    """The run's last checkpoint, loaded the way the trainer loads it (weights_only)."""
    path = last_checkpoint_file(run_dir)
    assert path is not None, f"no checkpoint whose name contains 'last' under {run_dir}"
    from src.engine.checkpoint.files import load_checkpoint

    return load_checkpoint(path)


def read_metrics(run_dir: Path, split: str = "train") -> list[dict]:
    """Rows of <run dir>/metrics.jsonl for one split, in file order."""
    path = run_dir / "metrics.jsonl"
    assert path.is_file(), f"{path} is missing"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("split") == split]


def state_dict_max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[float, str]:
    """Largest absolute difference over matching floating-point entries, and its key.

    Keys must match exactly and non-float entries (num_batches_tracked) must be equal.
    """
    assert set(a) == set(b), f"different keys: {sorted(set(a) ^ set(b))}"
    worst, worst_key = 0.0, ""
    for key in a:
        ta, tb = a[key], b[key]
        assert ta.shape == tb.shape, f"{key}: shapes {tuple(ta.shape)} vs {tuple(tb.shape)}"
        if not ta.is_floating_point():
            assert torch.equal(ta, tb), f"{key}: {ta} vs {tb}"
            continue
        diff = (ta.double() - tb.double()).abs().max().item() if ta.numel() else 0.0
        if diff > worst:
            worst, worst_key = diff, key
    return worst, worst_key
