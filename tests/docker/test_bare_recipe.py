"""The bare-machine test's own machinery, checked without buildah: its scripts, the README parity, pip sources.

These run everywhere (no `docker` marker): they guard that the bare machine holds exactly what the
README's requirements list, that its image is remade when its recipe changes, and what the container's
pip is given.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.docker import bare_image, pip_sources
from tests.docker.images import REPO

SCRIPTS = [bare_image.BARE_RECIPE, Path(__file__).with_name("bare_machine_steps.sh")]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_refuses_wrong_arguments(script: Path) -> None:
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "usage:" in proc.stderr


def test_bare_machine_holds_the_readme_packages() -> None:
    packages = bare_image.recipe_packages(bare_image.BARE_RECIPE.read_text())
    readme = (REPO / "README.md").read_text()
    lines = re.findall(r"`apt-get install ([^`]+)`", readme)
    assert lines, "README.md names no `apt-get install ...` for its requirements"
    assert lines[0].split() == packages, (
        f"README's requirements install {lines[0].split()}, the bare machine {packages}: keep them equal")


def test_bare_tag_follows_the_recipe(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    tag = bare_image.bare_tag()
    assert tag.startswith(bare_image.BARE_REPOSITORY + ":")
    edited = tmp_path / "make_bare_image.sh"
    edited.write_bytes(bare_image.BARE_RECIPE.read_bytes() + b"\n# edited\n")
    monkeypatch.setattr(bare_image, "BARE_RECIPE", edited)
    assert bare_image.bare_tag() != tag, "an edited recipe must make a new image"


_LISTING = """:env:.find-links='/env/wheels'
global.find-links='/file/wheels'
global.extra-index-url='file:///mirror/simple https://example.org/simple'
global.index-url='https://pypi.org/simple'
install.index-url='https://install.example/simple'
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.no-cache-dir='true'
download.find-links='/not/for/install'
"""


def test_pip_settings_merge_as_pip_does() -> None:
    settings = pip_sources.host_pip_settings(_LISTING)
    assert settings == {
        "find-links": "/env/wheels",  # PIP_FIND_LINKS overrides the files
        "extra-index-url": "file:///mirror/simple https://example.org/simple",
        "index-url": "https://install.example/simple",  # [install] overrides [global]
        "cert": "/etc/ssl/certs/ca-certificates.crt",
    }  # no-cache-dir is not forwarded; [download] does not apply to `pip install`


def test_pip_local_paths_are_the_existing_folders_and_files(tmp_path: Path) -> None:
    (tmp_path / "mirror" / "simple").mkdir(parents=True)
    (tmp_path / "wheels" / "extra").mkdir(parents=True)
    (tmp_path / "constraints.txt").write_text("torch<=2.14.1\n")
    settings = {
        "extra-index-url": f"file://{tmp_path}/mirror/simple https://example.org/simple",
        "find-links": f"{tmp_path}/wheels {tmp_path}/wheels/extra {tmp_path}/missing",
        "constraint": f"{tmp_path}/constraints.txt",
    }
    # The index's parent (its pages link to ../files), each folder once, nothing missing or remote.
    assert pip_sources.local_paths(settings) == [tmp_path / "constraints.txt", tmp_path / "mirror",
                                                 tmp_path / "wheels"]
