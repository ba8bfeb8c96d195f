"""Fixtures of the docker tests: a buildah storage, the cached base image, the built image, a run in it.

The tests that use them are marked `docker` and skip, naming what is missing, without root, without
buildah (or debootstrap, when the base image is not cached yet), or when no storage driver works.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.docker import images
from tests.docker.buildah import Buildah, BuildahError, choose_storage, missing_requirements

# The image's user gets these ids (USER_UID/USER_GID build arguments): the "host user" that owns
# what the container writes to the mounted outputs folder. The tests run as root, so they cannot
# use their own ids (the image refuses root); sudo's caller if there is one, else 1000.
HOST_UID = int(os.environ.get("SUDO_UID") or 1000)
HOST_GID = int(os.environ.get("SUDO_GID") or 1000)
CONTAINER_HOSTNAME = "synctrain-test"


@dataclass
class BuiltImage:
    """The repository's Dockerfile built on the local base, and what the build reported."""

    storage: Buildah
    tag: str
    base: str
    base_seconds: float  # 0 when the base came from the cache
    build_seconds: float
    log_dir: Path
    config: dict = field(default_factory=dict)

    def run(self, command: list[str], mounts: dict[Path, str] | None = None,
            timeout: float = 900) -> subprocess.CompletedProcess:
        """Run `command` in a fresh container of the image, as its USER, in its WORKDIR; remove it after."""
        # The container's hostname must resolve, as `docker run` makes it do: torchrun's rendezvous
        # looks it up, and an unknown name waits on DNS instead of starting the workers.
        container = self.storage.run("from", "--pull=never", "--add-host", f"{CONTAINER_HOSTNAME}:127.0.0.1",
                                     self.tag, timeout=300).stdout.strip()
        try:
            volumes = [arg for host, inside in (mounts or {}).items() for arg in ("--volume", f"{host}:{inside}")]
            # --isolation chroot: what works here without a daemon; the network is the host's
            # (torchrun's rendezvous and gloo use the loopback).
            return self.storage.run("run", "--isolation", "chroot", "--hostname", CONTAINER_HOSTNAME, *volumes,
                                    container, "--", *command, timeout=timeout, check=False)
        finally:
            self.storage.run("rm", container, check=False, timeout=300)

    @property
    def entrypoint(self) -> list[str]:
        """The image's ENTRYPOINT, which `docker run IMAGE ARGS...` puts before ARGS."""
        return list(self.config.get("Entrypoint") or [])


@pytest.fixture(scope="session")
def buildah_storage() -> Buildah:
    """A buildah storage that works on this machine (overlay, else vfs)."""
    problem = missing_requirements()
    if problem:
        pytest.skip(problem)
    storage, note = choose_storage()
    if storage is None:
        pytest.skip(note)
    return storage


@pytest.fixture(scope="session")
def base_image(buildah_storage: Buildah, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, float]:
    """The local Debian base image with the pinned torch/torchvision (made once per machine and key)."""
    if buildah_storage.image_id(images.base_tag()) is None and shutil.which("debootstrap") is None:
        pytest.skip("debootstrap not found (needed once, to make the base image): as root, "
                    "scripts/install_system_deps.sh installs it (apt-get install debootstrap)")
    log = tmp_path_factory.mktemp("base") / "make_base_image.log"
    return images.ensure_base_image(buildah_storage, log)


def native_cpu_capability() -> str:
    """The CPU variant of the kernels this machine loads (the only one the test image needs)."""
    from src.syncbn.extension import default_cpu_capability

    return default_cpu_capability()


@pytest.fixture(scope="session")
def built_image(buildah_storage: Buildah, base_image: tuple[str, float],
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuiltImage]:
    """The repository's Dockerfile built on the base; removed (with its unreusable layers) afterwards."""
    base, base_seconds = base_image
    log_dir = tmp_path_factory.mktemp("image")
    tag = f"localhost/synctrain-test:{os.getpid()}-{int(time.time())}"
    build_args = {
        "BASE_IMAGE": base,
        "BUILD_CUDA_KERNELS": "0",  # the base has no nvcc
        # One CPU variant, this machine's: the tests run here, and each variant costs a minute or
        # two of compiling on every source change.
        "SYNCBN_CPU_CAPABILITIES": native_cpu_capability(),
        "USER_UID": str(HOST_UID),
        "USER_GID": str(HOST_GID),
        "TORCH_INDEX_URL": "",  # the base has torch; download.pytorch.org need not be reachable
    }
    try:
        seconds = images.build_image(buildah_storage, tag, build_args, log_dir / "bud.log")
        inspected = buildah_storage.inspect_image(tag)
        config = inspected.get("OCIv1", {}).get("config", {})
        yield BuiltImage(storage=buildah_storage, tag=tag, base=base, base_seconds=base_seconds,
                         build_seconds=seconds, log_dir=log_dir, config=config)
    except BuildahError as exc:
        pytest.fail(str(exc))
    finally:
        images.remove_build(buildah_storage, tag)


@dataclass
class TrainedRun:
    """A short training run inside the image, written to a host folder mounted at /outputs."""

    outputs: Path
    run_dir: Path
    proc: subprocess.CompletedProcess
    seconds: float


@pytest.fixture(scope="session")
def trained_run(built_image: BuiltImage, tmp_path_factory: pytest.TempPathFactory) -> TrainedRun:
    """The default job on 2 processes for a few steps, launched as `docker run IMAGE <args>` would."""
    outputs = tmp_path_factory.mktemp("outputs")
    os.chown(outputs, HOST_UID, HOST_GID)  # the image's user must be able to write there
    args = ["--standalone", "--nproc_per_node=2", "train.py", "hydra.run.dir=/outputs/run",
            "trainer.max_steps=4", "trainer.checkpoint_every=2", "trainer.log_every=1",
            "data.train_size=256", "data.val_size=64", "data.batch_size=16"]
    t0 = time.monotonic()
    proc = built_image.run([*built_image.entrypoint, *args], mounts={outputs: "/outputs"}, timeout=1200)
    return TrainedRun(outputs=outputs, run_dir=outputs / "run", proc=proc, seconds=time.monotonic() - t0)
