"""The bare-machine image: Debian 12 with only the README's prerequisites, made once per machine.

tests/docker/make_bare_image.sh (debootstrap of the README's `apt-get install` packages), tagged
`localhost/synctrain-bare:<key>` where the key hashes the recipe, so editing the package list makes a
new image and the old one is removed. Small (a few hundred MB, no pip packages): the test installs
everything else the way a user does, through `make`.
"""
from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

from tests.docker.buildah import Buildah, BuildahError
from tests.docker.images import base_key, machine_lock

BARE_RECIPE = Path(__file__).with_name("make_bare_image.sh")
BARE_REPOSITORY = "localhost/synctrain-bare"


def recipe_packages(recipe: str) -> list[str]:
    """The Debian packages the recipe installs (its PACKAGES line)."""
    match = re.search(r'^PACKAGES="([^"]+)"', recipe, re.M)
    if match is None:
        raise ValueError(f"{BARE_RECIPE.name} has no PACKAGES=\"...\" line")
    return match.group(1).split()


def bare_tag() -> str:
    """The tag of the bare image for this checkout's recipe."""
    return f"{BARE_REPOSITORY}:{base_key(BARE_RECIPE.read_bytes(), [])}"


def ensure_bare_image(storage: Buildah, log: Path) -> tuple[str, float]:
    """The bare image's tag, made now if this storage lacks it; and the seconds it took (0: cached)."""
    tag = bare_tag()
    # Its own lock: the base image (images.ensure_base_image) may be in the making meanwhile.
    with machine_lock("bare-image"):
        if storage.image_id(tag) is not None:
            return tag, 0.0
        t0 = time.monotonic()
        env = {"BUILDAH": " ".join(storage.argv), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        with open(log, "a") as out:
            proc = subprocess.run(["bash", str(BARE_RECIPE), tag], stdout=out, stderr=subprocess.STDOUT,
                                  env=env, timeout=3600)
        if proc.returncode != 0:
            raise BuildahError(f"{BARE_RECIPE.name} failed (exit {proc.returncode}); its output: {log}\n"
                               + log.read_text()[-4000:])
        for old in storage.image_names(BARE_REPOSITORY):
            if old != tag:
                storage.remove_image(old)
        return tag, time.monotonic() - t0
