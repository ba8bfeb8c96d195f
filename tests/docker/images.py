"""The two images of the docker tests: the cached Debian base, and the repository's Dockerfile built on it.

Base: tests/docker/make_base_image.sh (debootstrap + the pinned torch/torchvision), tagged
`localhost/synctrain-base:<key>`, where the key hashes the recipe and the torch/torchvision pins of
requirements.txt (the only requirements the base holds: the other pins are the Dockerfile's own
layer, so editing them does not remake the 5 GB base). Made once per machine and key.

Build: `buildah bud --layers` of the real Dockerfile with --build-arg BASE_IMAGE=<base>. `--layers`
keeps one cached image per step, so a second build reuses the requirements layer and, with
unchanged sources, every layer. After the tests the built image and the cached steps nobody can
reuse are removed; the requirements step stays, tagged `localhost/synctrain-layer-cache:deps`.
"""
from __future__ import annotations

import fcntl
import hashlib
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.docker.buildah import CACHE_ROOT, Buildah, BuildahError

REPO = Path(__file__).resolve().parents[2]
BASE_RECIPE = Path(__file__).with_name("make_base_image.sh")
BASE_REPOSITORY = "localhost/synctrain-base"
LAYER_CACHE_TAG = "localhost/synctrain-layer-cache:deps"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")  # Debian's; its pip reads the same path


def base_requirements() -> list[str]:
    """The torch and torchvision pins of requirements.txt (what the base image installs)."""
    text = (REPO / "requirements.txt").read_text()
    pins = re.findall(r"^((?:torch|torchvision)==[^\s#]+)", text, re.M)
    if len(pins) != 2:
        raise ValueError(f"requirements.txt should pin torch== and torchvision==, found {pins}")
    return pins


def base_key(recipe: bytes, requirements: list[str]) -> str:
    """Cache key of the base image: the recipe's bytes and the pins it installs."""
    digest = hashlib.sha256(recipe)
    digest.update("\n".join(sorted(requirements)).encode())
    return digest.hexdigest()[:16]


def base_tag() -> str:
    """The tag of the base image for this checkout's recipe and pins."""
    return f"{BASE_REPOSITORY}:{base_key(BASE_RECIPE.read_bytes(), base_requirements())}"


@contextmanager
def machine_lock(name: str) -> Iterator[None]:
    """An exclusive lock shared by every test session on this machine (two `make test` at once)."""
    CACHE_ROOT.mkdir(parents=True, exist_ok=True)
    with open(CACHE_ROOT / f"{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_base_image(storage: Buildah, log: Path) -> tuple[str, float]:
    """The base image's tag, made now if this storage lacks it; and the seconds it took (0: cached)."""
    tag = base_tag()
    with machine_lock("base-image"):
        if storage.image_id(tag) is not None:
            return tag, 0.0
        t0 = time.monotonic()
        wheelhouse = CACHE_ROOT / "wheelhouse"
        # The host's pip fetches the wheels (from its index, or a local mirror of one); the base's
        # Python is Debian 12's 3.11, so the host's must be 3.11 on x86_64 Linux too.
        if sys.version_info[:2] != (3, 11):
            raise BuildahError(f"the base image has Python 3.11; this pip runs on {sys.version.split()[0]} "
                               "and would download wheels for the wrong Python")
        with open(log, "a") as out:
            subprocess.run([sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--dest",
                            str(wheelhouse), *base_requirements()],
                           stdout=out, stderr=subprocess.STDOUT, check=True, timeout=3600)
            env = {"BUILDAH": " ".join(storage.argv), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
            proc = subprocess.run(["bash", str(BASE_RECIPE), tag, str(wheelhouse), *base_requirements()],
                                  stdout=out, stderr=subprocess.STDOUT, env=env, timeout=3600)
        if proc.returncode != 0:
            raise BuildahError(f"{BASE_RECIPE.name} failed (exit {proc.returncode}); its output: {log}\n"
                               + log.read_text()[-4000:])
        # The wheels live on in the image's site-packages; older bases are dead weight.
        subprocess.run(["rm", "-rf", str(wheelhouse)], check=False)
        for old in storage.image_names(BASE_REPOSITORY):
            if old != tag:
                storage.remove_image(old)
        return tag, time.monotonic() - t0


def build_image(storage: Buildah, tag: str, build_args: dict[str, str], log: Path) -> float:
    """`buildah bud --layers` of the repository's Dockerfile as `tag`; the seconds it took."""
    # --format docker: the OCI image format has no SHELL, and ours (bash -o pipefail) must apply.
    # --force-rm: a failed step's container goes too, not only a successful one's.
    argv = ["bud", "--isolation", "chroot", "--layers", "--force-rm", "--pull=never", "--format", "docker",
            "--file", str(REPO / "Dockerfile"), "--tag", tag]
    if HOST_CA_BUNDLE.is_file():
        # pip inside the build reaches PyPI with the host's trust (which may include the CA of a
        # TLS-inspecting proxy): the host's bundle over the base's for the RUN steps only, bind
        # mounted, so it never lands in a layer.
        argv += ["--volume", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro"]
    for key, value in build_args.items():
        argv += ["--build-arg", f"{key}={value}"]
    t0 = time.monotonic()
    with machine_lock("image-build"):
        # One stream: the step lines and the "--> <id>" lines must stay in order for the parser below.
        proc = subprocess.run([*storage.argv, *argv, str(REPO)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=3600)
    seconds = time.monotonic() - t0
    log.write_text(proc.stdout)
    if proc.returncode != 0:
        raise BuildahError(f"buildah bud failed (exit {proc.returncode}); full output: {log}\n"
                           + proc.stdout[-6000:])
    deps_step = requirements_step_image(proc.stdout)
    if deps_step is not None:
        storage.run("tag", deps_step, LAYER_CACHE_TAG, timeout=120)
    return seconds


def requirements_step_image(bud_output: str) -> str | None:
    """The image id buildah committed for the `pip install -r requirements.txt` step, from its output."""
    lines = bud_output.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("STEP ") and "-r requirements.txt" in line:
            for later in lines[i + 1:]:
                if later.startswith("STEP "):
                    return None
                match = re.fullmatch(r"--> ([0-9a-f]{10,64})", later.strip())  # buildah 1.28 prints 11 digits
                if match:
                    return match.group(1)
    return None


def remove_build(storage: Buildah, tag: str) -> None:
    """Remove the built image and the cached steps no later build can reuse (the tests remove their
    containers themselves)."""
    storage.remove_image(tag)
    storage.prune_dangling()
