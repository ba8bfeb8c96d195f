"""buildah as the docker tests use it: root, chroot isolation, a storage of our own outside the clone.

No Docker daemon runs on the test machines; Debian's buildah builds a Dockerfile (`bud`) and runs
commands in an image (`from` + `run`) without one. `podman run` is no alternative here (it fails on
setrlimit); `buildah run --isolation chroot` works. The storage (images, layer cache) lives in
SYNCTRAIN_CONTAINERS_DIR (default /var/cache/synctrain/containers-<driver>), so a second `make test`
on the same machine, from any clone, finds the base image and the cached layers of the first.
The driver is overlay when the kernel allows it here (layers are diffs), else vfs (every step copies
the whole file system: slower, several GB per step, but works everywhere).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

CACHE_ROOT = Path(os.environ.get("SYNCTRAIN_CACHE_DIR", "/var/cache/synctrain"))


class BuildahError(RuntimeError):
    """A buildah command failed; the message holds the command and the end of its output."""


def missing_requirements() -> str | None:
    """Why the docker tests cannot run on this machine (None: they can)."""
    if os.geteuid() != 0:
        return ("the docker tests need root (buildah with chroot isolation, debootstrap); "
                "run `make test` as root")
    if shutil.which("buildah") is None:
        return ("buildah not found: as root, scripts/install_system_deps.sh installs it "
                "(apt-get install buildah debootstrap)")
    return None


@dataclass(frozen=True)
class Buildah:
    """One buildah storage (root directory + storage driver) and the commands the tests run on it."""

    driver: str
    root: Path
    runroot: Path

    @classmethod
    def for_driver(cls, driver: str) -> "Buildah":
        """The storage for `driver` under SYNCTRAIN_CONTAINERS_DIR (or the cache root)."""
        base = Path(os.environ.get("SYNCTRAIN_CONTAINERS_DIR", CACHE_ROOT))
        # A storage root is bound to the driver that created it: one folder per driver.
        return cls(driver=driver, root=base / f"containers-{driver}",
                   runroot=Path("/run/synctrain") / f"containers-{driver}")

    @property
    def argv(self) -> list[str]:
        """`buildah` with the global options that select this storage."""
        return ["buildah", "--root", str(self.root), "--runroot", str(self.runroot),
                "--storage-driver", self.driver]

    def run(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
        """Run `buildah <global options> args...`; raise BuildahError with its output on failure."""
        cmd = [*self.argv, *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise BuildahError(f"{' '.join(cmd)} exited {proc.returncode}:\n"
                               f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
        return proc

    def works(self) -> str | None:
        """None when this driver can create, mount and remove a container here, else buildah's error."""
        try:
            container = self.run("from", "scratch", timeout=120).stdout.strip()
            try:
                self.run("mount", container, timeout=120)
            finally:
                self.run("rm", container, timeout=120, check=False)
        except (BuildahError, subprocess.TimeoutExpired) as exc:
            return str(exc)
        return None

    def image_id(self, name: str) -> str | None:
        """The id of image `name`, or None when this storage does not have it."""
        proc = self.run("images", "--quiet", "--no-trunc", name, check=False, timeout=120)
        ids = proc.stdout.split()
        return ids[0] if proc.returncode == 0 and ids else None

    def image_names(self, repository: str) -> list[str]:
        """Every `repository:tag` of this storage whose repository is `repository`."""
        proc = self.run("images", "--json", check=False, timeout=120)
        if proc.returncode != 0 or not proc.stdout.strip():
            return []
        names = [n for image in json.loads(proc.stdout) for n in (image.get("names") or [])]
        return [n for n in names if n.rsplit(":", 1)[0] == repository]

    def inspect_image(self, name: str) -> dict:
        """`buildah inspect` of an image, as a dict."""
        return json.loads(self.run("inspect", "--type", "image", name, timeout=120).stdout)

    def remove_image(self, name: str) -> None:
        """Remove an image by name or id; a missing one is no error."""
        self.run("rmi", "--force", name, check=False, timeout=300)

    def prune_dangling(self) -> None:
        """Remove untagged images without children (the layer cache of builds that are no more)."""
        for _ in range(20):  # a chain of intermediate images frees one level per pass
            before = self.run("images", "--all", "--quiet", check=False, timeout=120).stdout.split()
            self.run("rmi", "--prune", check=False, timeout=600)
            after = self.run("images", "--all", "--quiet", check=False, timeout=120).stdout.split()
            if len(after) >= len(before):
                return


def choose_storage() -> tuple[Buildah | None, str]:
    """The first driver that works here (SYNCTRAIN_BUILDAH_DRIVER forces one), with a note on why."""
    forced = os.environ.get("SYNCTRAIN_BUILDAH_DRIVER")
    drivers = [forced] if forced else ["overlay", "vfs"]
    errors = []
    for driver in drivers:
        storage = Buildah.for_driver(driver)
        problem = storage.works()
        if problem is None:
            return storage, f"storage driver {driver}"
        errors.append(f"{driver}: {problem.strip()[-600:]}")
    return None, "no buildah storage driver works here:\n" + "\n".join(errors)
