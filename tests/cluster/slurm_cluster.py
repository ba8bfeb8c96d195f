"""A one-machine SLURM cluster for the tests: munged, slurmctld and slurmd (Debian's slurm-wlm and
munge packages) configured in a temporary directory, started once per test session, stopped after it.

Everything runs as root (slurmd starts every job as its submitting user, which takes root), on free
ports, with one node named after this machine (its short hostname, which the sbatch script resolves for
the rendezvous, as on a real cluster) holding this machine's CPUs. Nothing of an existing
SLURM installation is read or changed: every command gets SLURM_CONF pointing at the temporary config.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional

REQUIRED = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "sinfo")
INSTALL_HINT = "apt-get install slurm-wlm munge (as root; `make test` does it in CI)"


def missing_requirements() -> Optional[str]:
    """Why a local cluster cannot start here (None when it can): not root, or which programs are missing."""
    if os.geteuid() != 0:
        return "the local SLURM cluster needs root (slurmd starts jobs as their user)"
    missing = [tool for tool in REQUIRED if _which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not found: {INSTALL_HINT}"
    try:
        socket.gethostbyname(NODE)
    except OSError:
        return f"this machine's hostname {NODE!r} does not resolve (the node's address for the rendezvous)"
    return None


NODE = socket.gethostname().split(".")[0]


def _which(tool: str) -> Optional[str]:
    """The program's path, also in the sbin folders where Debian puts the daemons (often not on PATH)."""
    return shutil.which(tool, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalSlurm:
    """The running daemons and the environment that points SLURM's commands at them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "slurm.conf"
        self._daemons: list[subprocess.Popen] = []
        self._munged_pid: Optional[int] = None

    @property
    def env(self) -> dict[str, str]:
        """This process's environment plus SLURM_CONF (for sbatch, scontrol, ... and the jobs)."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self, timeout: float = 60) -> None:
        """Start munged, slurmctld and slurmd; RuntimeError (with their logs) if the node is not up in time."""
        munge = self.root / "munge"
        munge.mkdir(mode=0o755)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        socket_path = munge / "munge.socket"
        pid_file = munge / "munged.pid"
        # --force: munged refuses to run as root otherwise. It daemonizes; its pid file says whom to stop.
        subprocess.run([_which("munged"), "--force", f"--socket={socket_path}", f"--key-file={key}",
                        f"--pid-file={pid_file}", f"--log-file={munge / 'munged.log'}",
                        f"--seed-file={munge / 'munged.seed'}"], check=True, timeout=30, capture_output=True)
        self._munged_pid = int(pid_file.read_text().split()[0])
        for sub in ("state", "spool", "log"):
            (self.root / sub).mkdir()
        self.conf.write_text(self._config(socket_path))
        for argv in (["slurmctld", "-D", "-i"], ["slurmd", "-D", "-N", NODE]):
            log = open(self.root / "log" / f"{argv[0]}.stdout", "wb")
            self._daemons.append(subprocess.Popen([_which(argv[0]), *argv[1:]], env=self.env, stdout=log,
                                                  stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.run(["sinfo", "-h", "-n", NODE, "-o", "%T"], check=False).stdout.strip()
            if state in ("idle", "mixed", "allocated"):
                return
            if any(d.poll() is not None for d in self._daemons):
                break
            time.sleep(0.5)
        raise RuntimeError(f"the local SLURM node did not come up within {timeout:.0f} s:\n{self.logs()}")

    def _config(self, munge_socket: Path) -> str:
        cpus = len(os.sched_getaffinity(0))
        # cred_expire: also how long SLURM holds a requeued job before starting it again (default 120 s).
        return f"""\
ClusterName=synctraintest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket},cred_expire=10
StateSaveLocation={self.root / 'state'}
SlurmdSpoolDir={self.root / 'spool'}
SlurmctldPidFile={self.root / 'slurmctld.pid'}
SlurmdPidFile={self.root / 'slurmd.pid'}
SlurmctldLogFile={self.root / 'log' / 'slurmctld.log'}
SlurmdLogFile={self.root / 'log' / 'slurmd.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
KillWait=30
MinJobAge=600
JobRequeue=1
NodeName={NODE} CPUs={cpus} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes={NODE} Default=YES MaxTime=INFINITE State=UP
"""

    def run(self, argv: list[str], check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        """A SLURM command against this cluster."""
        proc = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr}")
        return proc

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, ExitCode, Restarts, ...)."""
        out = self.run(["scontrol", "-o", "show", "job", job_id]).stdout
        return dict(field.split("=", 1) for field in out.split() if "=" in field)

    def wait_for(self, job_id: str, states: tuple[str, ...], timeout: float) -> dict[str, str]:
        """Poll until the job is in one of `states`; fail with the job record and its output otherwise."""
        deadline = time.monotonic() + timeout
        info: dict[str, str] = {}
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in states:
                return info
            time.sleep(0.5)
        out = Path(info.get("StdOut", "/nonexistent"))
        raise AssertionError(f"job {job_id} not {states} within {timeout:.0f} s: {info}\n"
                             + (out.read_text()[-6000:] if out.is_file() else "(no output file)"))

    def logs(self) -> str:
        """The tail of every daemon log (for failure messages)."""
        parts = []
        for log in sorted((self.root / "log").glob("*")) + [self.root / "munge" / "munged.log"]:
            if log.is_file():
                parts.append(f"--- {log.name}\n" + log.read_text(errors="replace")[-2000:])
        return "\n".join(parts)

    def stop(self) -> None:
        """Cancel what is left and stop the daemons this object started (nothing else)."""
        if self._daemons and all(d.poll() is None for d in self._daemons):
            self.run(["scancel", "--full", "--user=root"], check=False)
        for daemon in self._daemons:
            if daemon.poll() is None:
                os.killpg(daemon.pid, signal.SIGTERM)
        for daemon in self._daemons:
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, signal.SIGKILL)
                daemon.wait(timeout=30)
        if self._munged_pid is not None:
            try:
                os.kill(self._munged_pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
