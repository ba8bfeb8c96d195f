"""The host's pip sources for a container: its pip settings as one pip.conf, and the local folders they name.

A container that installs requirements.txt should find what the host's pip finds (a CI machine may keep
torch and its multi-GB nvidia-* wheels on disk, behind find-links or a file:// index) instead of fetching
them again. So the settings the host's pip uses (`pip config list`: global, user, site and PIP_*
environment) become the container's pip.conf, and every local path they name is mounted read-only at the
same place. Downloads from the network land in PIP_CACHE, a per-machine cache beside the docker tests'
other caches (images.py's wheelhouse, the buildah storage), so a second run downloads nothing.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from tests.docker.buildah import CACHE_ROOT

PIP_CACHE = CACHE_ROOT / "pip-cache"
# The settings handed on: where packages come from, how they are trusted, what caps them.
FORWARDED = ("index-url", "extra-index-url", "find-links", "cert", "constraint", "trusted-host", "timeout",
             "default-timeout")
# `pip config list` prints the files' settings already merged, by section; for `pip install`, [install]
# overrides [global] and PIP_* variables (":env:") override both. Other sections do not apply to it.
SCOPE_ORDER = ("global", "install", ":env:")


@dataclass(frozen=True)
class PipSources:
    """A pip.conf text for the container and the host paths it needs mounted read-only (same path inside)."""

    config: str
    mounts: tuple[Path, ...]


def host_pip_settings(listing: str) -> dict[str, str]:
    """The forwarded settings from `pip config list` output (`scope.key='value'` lines), scopes merged."""
    ranked: dict[str, tuple[int, str]] = {}
    for line in listing.splitlines():
        name, sep, raw = line.partition("=")
        if not sep or "." not in name:
            continue
        scope, key = name.rsplit(".", 1)
        if key not in FORWARDED or scope not in SCOPE_ORDER:
            continue
        rank = SCOPE_ORDER.index(scope)
        value = ast.literal_eval(raw) if raw[:1] in "'\"" else raw
        if key not in ranked or rank >= ranked[key][0]:
            ranked[key] = (rank, value)
    return {key: value for key, (_, value) in ranked.items()}


def local_paths(settings: dict[str, str]) -> list[Path]:
    """The existing host paths the settings read: find-links folders, file:// indexes, cert/constraint files."""
    paths: list[Path] = []
    for key, value in settings.items():
        for item in value.split():
            parsed = urlparse(item)
            if parsed.scheme not in ("", "file"):
                continue
            path = Path(parsed.path if parsed.scheme == "file" else item)
            if key.endswith("index-url"):
                # A PEP 503 index page links to its files relatively (here ../../files/x.whl): the
                # index's parent holds both.
                path = path.parent
            if path.is_absolute() and path.exists():
                paths.append(path)
    # A folder mounted already carries whatever lies below it.
    unique = sorted(set(paths))
    return [p for p in unique if not any(q != p and q in p.parents for q in unique)]


def pip_sources(python: str = sys.executable) -> PipSources:
    """What the host's pip (of `python`) is configured with, as a pip.conf and its mounts."""
    listing = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             timeout=120, check=True).stdout
    settings = host_pip_settings(listing)
    lines = ["[global]", *(f"{key} = {value}" for key, value in sorted(settings.items()))]
    return PipSources(config="\n".join(lines) + "\n", mounts=tuple(local_paths(settings)))
