"""The README's Quick start on a bare machine: a clone, `make train`, `make test-fast`, nothing installed before.

The README promises that its two commands work on a fresh machine with only its listed prerequisites
(Python 3.11 with venv and headers, g++, make, git). The machine here is a container of Debian 12 made
with debootstrap from exactly those packages (tests/docker/make_bare_image.sh): no ninja-build, no CUDA,
no pip packages, nothing of the host's venv. In it, tests/docker/bare_machine_steps.sh clones the
repository (the committed HEAD of this checkout, from its git folder mounted read-only), then runs
`make train` shortened to 4 optimizer steps on 2 processes and `make test-fast` on a few kernel tests,
which must build the SyncBN kernels from scratch with the ninja that requirements.txt puts in the venv.

The venv's `pip install -r requirements.txt` sees the host's pip sources (tests/docker/pip_sources.py:
local wheel folders mounted read-only, a per-machine download cache), so torch is not fetched again.
It still unpacks several GB of wheels. Measured on a busy 2-core VM: 14 min in all with the image cached
(venv and requirements 5 min, the kernels' first build plus 4 steps 6 min, test-fast 0.6 min, removing the
container's 7 GB 1.7 min); making the image once per machine adds 3 min.
"""
from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.docker.bare_image import ensure_bare_image
from tests.docker.buildah import Buildah, BuildahError
from tests.docker.conftest import BuiltImage
from tests.docker.images import REPO
from tests.docker.pip_sources import PIP_CACHE, pip_sources
from tests.support.shared_dir import made_once

# Its own xdist group (tests/conftest.py puts the rest of tests/docker in one): it shares no fixture with the
# image tests, so under `make test` it runs beside them on another worker rather than after them.
pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(5400),
              pytest.mark.xdist_group("docker-bare-machine")]

STEPS = Path(__file__).with_name("bare_machine_steps.sh")
TRAIN_ARGS = ("hydra.run.dir=/outputs/run trainer.max_steps=4 trainer.checkpoint_every=2 trainer.log_every=1 "
              "data.train_size=256 data.val_size=64 data.batch_size=16 trainer.progress_bar=false")
# Tests that load the compiled kernels (the first of them builds them), a few seconds once built.
TEST_ARGS = "tests/syncbn/test_kernels.py -k 'single_element or gather_stats or empty_input'"
PIP_CONFIG = "/etc/synctrain-test/pip.conf"
PIP_CACHE_INSIDE = "/var/cache/synctrain-pip"
# What a login shell on a fresh Debian has: nothing of the host's environment leaks in.
CLEAN_ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8"]


@dataclass
class BareRun:
    """The steps' exit statuses, logs and outputs, read from the folder the container wrote."""

    folder: Path

    @property
    def status(self) -> dict[str, int]:
        """Exit status per step that ran (clone, train, test_fast, ...)."""
        lines = (self.folder / "status").read_text().split("\n") if (self.folder / "status").exists() else []
        return {name: int(code) for name, code in (line.split() for line in lines if line.strip())}

    def log(self, step: str) -> str:
        """The output of one step ('' if it did not run)."""
        path = self.folder / f"{step}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def report(self, step: str) -> str:
        """A failure message: every status, the end of the step's log and of the container's output."""
        return (f"statuses {self.status}\n--- {step}.log (end)\n{self.log(step)[-6000:]}\n"
                f"--- container (end)\n{self.log('container')[-3000:]}")


def _checkout_commit() -> tuple[Path, str]:
    """The git folder holding this checkout's objects (a worktree's is the main one's) and its HEAD commit."""
    git = ["git", "-C", str(REPO)]
    common = subprocess.run([*git, "rev-parse", "--path-format=absolute", "--git-common-dir"], capture_output=True,
                            text=True, check=True).stdout.strip()
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    return Path(common), head


def _run_steps(storage: Buildah, folder: Path) -> None:
    """Make (or reuse) the bare image and run the README's steps in a fresh container of it, into `folder`."""
    outputs = folder / "outputs"
    outputs.mkdir()
    t0 = time.monotonic()
    try:
        tag, image_seconds = ensure_bare_image(storage, folder / "make_bare_image.log")
    except BuildahError as exc:
        pytest.fail(str(exc))
    sources = pip_sources()
    (folder / "pip.conf").write_text(sources.config)
    PIP_CACHE.mkdir(parents=True, exist_ok=True)
    git_dir, commit = _checkout_commit()
    mounts = {git_dir: "/src.git:ro", STEPS: "/steps.sh:ro", folder / "pip.conf": f"{PIP_CONFIG}:ro",
              PIP_CACHE: PIP_CACHE_INSIDE, outputs: "/outputs"}
    mounts.update({path: f"{path}:ro" for path in sources.mounts})
    machine = BuiltImage(storage=storage, tag=tag, base=tag, base_seconds=image_seconds, build_seconds=0.0,
                         log_dir=folder)
    env = [*CLEAN_ENV, f"PIP_CONFIG_FILE={PIP_CONFIG}", f"PIP_CACHE_DIR={PIP_CACHE_INSIDE}"]
    t1 = time.monotonic()
    proc = machine.run(["env", "-i", *env, "bash", "/steps.sh", commit, TRAIN_ARGS, TEST_ARGS],
                       mounts=mounts, timeout=4800)
    (outputs / "container.log").write_text(f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    timing = {"image_s": round(image_seconds, 1), "steps_s": round(time.monotonic() - t1, 1),
              "total_s": round(time.monotonic() - t0, 1), "commit": commit}
    (outputs / "timing.json").write_text(json.dumps(timing))
    print(f"bare machine: {timing}")  # shown with -s / -rP: where the minutes went


@pytest.fixture(scope="session")
def bare_run(buildah_storage: Buildah, tmp_path_factory: pytest.TempPathFactory) -> BareRun:
    """The README's steps run once per test run in a fresh bare-machine container."""
    folder = made_once(tmp_path_factory, "bare-machine", lambda f: _run_steps(buildah_storage, f))
    return BareRun(folder / "outputs")


def test_bare_machine_has_no_ninja_outside_the_venv(bare_run: BareRun) -> None:
    # Else the test would not cover a build that must find the venv's ninja.
    assert bare_run.status.get("ninja_on_path") == 1, bare_run.report("ninja_on_path")
    assert bare_run.status.get("venv_ninja") == 0, "make's setup put no ninja in .venv/bin\n" + bare_run.report(
        "train")


def test_make_train_trains_on_two_processes(bare_run: BareRun) -> None:
    for step in ("clone", "checkout", "train"):
        assert bare_run.status.get(step) == 0, bare_run.report(step)
    run_dir = bare_run.folder / "run"
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_steps = [m["step"] for m in metrics if m["split"] == "train"]
    assert train_steps and max(train_steps) == 4, f"expected 4 optimizer steps, got {train_steps}"
    assert any(m["split"] == "val" for m in metrics), "no validation metrics"
    assert (run_dir / "checkpoints" / "last.pt").is_file()
    assert (run_dir / "logs" / "rank1.log").is_file(), "rank 1 wrote no log: not 2 processes"


def test_make_test_fast_builds_and_tests_the_kernels(bare_run: BareRun) -> None:
    assert bare_run.status.get("test_fast") == 0, bare_run.report("test_fast")
    summary = bare_run.log("test_fast").strip().splitlines()[-1]
    assert re.search(r"\b[1-9]\d* passed\b", summary), summary
    assert not re.search(r"failed|error|skipped", summary), summary
