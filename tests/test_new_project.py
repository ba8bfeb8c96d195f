"""scripts/new_project.py: a new project holds the parts asked for, and nothing it keeps refers to what it left out.

Fast: the reference check (scripts/project_refs.py) on a small made-up template finds each kind of dangling
reference at its file:line and passes the same files once the references are gone; the markers
(scripts/project_parts.py) cut what they should and refuse mistakes; the real template makes a minimal, a
full and each one-part project with a clean check (project_parts.toml's globs all match).
Slow: the minimal and the full project written by the command line, each with its own git history, in one
virtual environment made from their (identical) requirements.txt without this repository's .venv, each
running its `make train` (shortened) and a subset of its own tests, and planning its whole suite
(`pytest --setup-plan`: every module imports, every fixture resolves).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from scripts import new_project
from scripts.project_parts import ManifestError, load_manifest, resolve, strip_markers, template_files, unmatched_globs
from scripts.project_refs import check
from src.syncbn.extension import extensions_dir

REPO = Path(__file__).resolve().parents[1]
MANIFEST = load_manifest()
OPTIONAL = [name for name, part in MANIFEST.parts.items() if not part.required]

# A made-up template: `seg` is a part; the kept files below refer to its files in every way the check knows.
TEMPLATE = {
    "Makefile": "train:\n\tpython train.py\n# part: seg\ngpu-check:\n\tbash scripts/gpu.sh\n# /part\n",
    "src/models/__init__.py": "",
    "src/models/deeplab.py": '@MODELS.register("deeplab_x", task="segmentation")\ndef build(cfg): ...\n',
    "conf/model/deeplab_x.yaml": "name: deeplab_x\n",
    "conf/data/voc.yaml": "name: voc\n",
    "conf/data/shapes.yaml": "name: shapes\n",
    "docs/seg.md": "# Segmentation\n",
    "docs/index.md": "# Index\n\n## Kept\n\n<!-- part: seg -->\n## Gone section\n<!-- /part -->\n",
    "scripts/gpu.sh": "",
    "scripts/k8s/job.yaml": "",
    "tests/support/runs.py": "import pytest\n\nA = 1\n# part: seg\nB = (1,\n     2)\n\n\n"
                             "@pytest.fixture\ndef seg_run(): ...\n# /part\n",
    "tests/test_clean.py": 'from tests.support.runs import A\n\nCMD = "python train.py data=shapes"  # docs/index.md\n',
}
SEG_FILES = {"src/models/deeplab.py", "conf/model/deeplab_x.yaml", "conf/data/voc.yaml", "docs/seg.md", "scripts/gpu.sh",
             "scripts/k8s/job.yaml"}
DANGLING = {
    "tests/test_a.py": "\n".join([
        "from src.models import deeplab",
        "from tests.support.runs import A, B",
        "import src.models.deeplab",
        'CMD = "python train.py model=deeplab_x data=voc"',
        'CFG = {"name": "deeplab_x"}',
        'JOB = REPO / "scripts" / "k8s" / "job.yaml"',
        'def test_x(seg_run): assert Path("docs/seg.md").exists()',
        ""]),
    "docs/more.md": "See [segmentation](seg.md), [the section](index.md#gone-section) and `make gpu-check`.\n",
    "src/bad.py": "X = (1,\n# part: seg\n     2)\n# /part\n",  # a region cut through a statement
    "src/data/mixed.py": '@DATASETS.register("mixed", task="seg")\ndef build(cfg): ...\n',  # the part's module
}
EXPECTED = {
    ("tests/test_a.py", 1, "src.models.deeplab"), ("tests/test_a.py", 2, "tests.support.runs.B"),
    ("tests/test_a.py", 3, "src.models.deeplab"), ("tests/test_a.py", 4, "model=deeplab_x"),
    ("tests/test_a.py", 4, "data=voc"), ("tests/test_a.py", 5, "deeplab_x"),
    ("tests/test_a.py", 6, "scripts/k8s/job.yaml"), ("tests/test_a.py", 7, "fixture seg_run"),
    ("tests/test_a.py", 7, "docs/seg.md"), ("docs/more.md", 1, "seg.md"),
    ("docs/more.md", 1, "index.md#gone-section"), ("docs/more.md", 1, "make gpu-check"),
    ("src/bad.py", 1, "does not compile"), ("src/data/mixed.py", 1, 'task="seg"'),
}


def _project(template: dict[str, str], parts: set[str]) -> dict[str, str]:
    return {path: strip_markers(text, parts, {"seg"}, path) for path, text in template.items()
            if "seg" in parts or path not in SEG_FILES}


def test_reference_check_names_each_dangling_reference_and_passes_a_clean_tree() -> None:
    template = {**TEMPLATE, **DANGLING}
    findings = check(template, _project(template, set()), tasks_left_out=["seg"])
    assert {(f.file, f.line, f.ref) for f in findings} == EXPECTED, "\n".join(map(str, findings))
    assert "tests/test_a.py:6 -> scripts/k8s/job.yaml" in {str(f) for f in findings}
    assert check(TEMPLATE, _project(TEMPLATE, set())) == []  # the clean files alone
    assert check(template, _project(template, {"seg"})) == []  # nothing left out: nothing dangles
    allowed = [("tests/test_a.py", "scripts/k8s/*", "a reason"), ("src/data/*", "task seg", "another")]
    assert len(check(template, _project(template, set()), allowed, ["seg"])) == len(EXPECTED) - 2


def test_markers_cut_regions_and_refuse_mistakes() -> None:
    text = ("A (cls<!-- part: seg -->, seg<!-- /part -->)\n| <!-- part: seg -->row | x |<!-- /part -->\n"
            "keep\n\n\n# part: seg\ndef f(): ...\n# /part\n\n\ndef g(): ...\n")
    assert strip_markers(text, set(), {"seg"}, "t") == "A (cls)\nkeep\n\n\ndef g(): ...\n"
    assert strip_markers(text, {"seg"}, {"seg"}, "t") == ("A (cls, seg)\n| row | x |\nkeep\n\n\ndef f(): ...\n\n\n"
                                                        "def g(): ...\n")
    for bad, message in [("# part: sge\nx\n# /part\n", "t:1: marker names unknown parts \\['sge'\\]"),
                         ("# part: seg\nx\n", "t:1: part marker not closed"),
                         ("x\n# /part\n", "t:2: a closing part marker without an opening one"),
                         ("x = 1  # part: seg\n", "t:1: a part marker must stand on a line of its own")]:
        with pytest.raises(ManifestError, match=message):
            strip_markers(bad, set(), {"seg"}, "t")


def test_flags_are_checked_before_anything_is_written(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("")
    for argv, message in [(["--tasks", "segmentation"], "every project has classification"),
                          (["--tasks", "classification,detect"], "unknown \\['detect'\\]"),
                          (["--cluster", "slurm,lsf"], "unknown \\['lsf'\\]")]:
        assert new_project.main([str(tmp_path / "new"), "--name", "X", *argv]) == 2
        assert re.search(message, capsys.readouterr().err)
    assert new_project.main([str(tmp_path / "taken"), "--name", "X"]) == 2
    assert "is not an empty folder" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("chosen", [(), *((p,) for p in OPTIONAL), tuple(OPTIONAL)],
                         ids=["minimal", *OPTIONAL, "full"])
def test_the_template_makes_clean_projects(chosen: tuple[str, ...]) -> None:
    """No kept file of this template refers to what the project leaves out (a new reference to a part's file
    fails here, with file:line, instead of in a user's project)."""
    if not chosen:
        assert unmatched_globs(MANIFEST, template_files()) == []  # every glob of project_parts.toml names a file
        page = (REPO / "docs" / "new-project.md").read_text()
        assert all(f"`{name}`" in page for name in MANIFEST.parts), "docs/new-project.md lists every part"
    parts = resolve(MANIFEST, set(chosen))
    selection, before, after, _ = new_project.plan(MANIFEST, parts, "Test project")
    findings = new_project.reference_findings(MANIFEST, before, after, parts)
    assert not findings, "\n".join(map(str, findings))
    assert after["README.md"].startswith("# Test project\n")
    assert not any(p.startswith("scripts/new_project") or p == "project_parts.toml" for p in after)


# ---------------------------------------------------------------------------------------------------------------
# Slow: real projects, their own environment, their own commands.

TIMEOUT_S = 900
QUICK_TRAIN = ("trainer.max_steps=2 trainer.epochs=1 data.train_size=256 data.val_size=32 data.num_workers=0 "
               "trainer.num_threads=1 trainer.progress_bar=false hydra.run.dir=outputs/smoke")
# A handful of the project's own test files: every config composes and validates, every model config builds,
# the dataset registry, the documentation's files and module names, one SyncBN-against-BatchNorm case.
OWN_TESTS = ["tests/config/test_validation.py", "tests/models/test_config.py", "tests/data/test_registry.py",
             "tests/test_docs.py", "tests/syncbn/test_distributed_equivalence.py::test_matches_one_process_batchnorm[W2-cpu-bn2d_unequal]"]


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = TIMEOUT_S) -> str:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(args)} in {cwd} failed ({proc.returncode}):\n{proc.stdout[-4000:]}" \
                                 f"\n{proc.stderr[-4000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def projects(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A minimal and a full project, written by the command line."""
    root = tmp_path_factory.mktemp("new_projects")
    made = {}
    for which, flags in (("minimal", []), ("full", ["--full"])):
        made[which] = root / which
        _run([sys.executable, "scripts/new_project.py", str(made[which]), "--name", f"My {which} project", *flags],
             REPO, timeout=120)
    return made


@pytest.fixture(scope="module")
def project_venv(projects: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One virtual environment for both projects (their requirements.txt are the same): `python -m venv` and
    `pip install -r requirements.txt` as `make setup` does, from pip's configured sources and cache."""
    requirements = {(p / "requirements.txt").read_text() for p in projects.values()}
    assert len(requirements) == 1, "the projects' requirements.txt differ: one environment cannot serve both"
    venv = tmp_path_factory.mktemp("project_venv") / "venv"
    start = time.monotonic()
    _run([sys.executable, "-m", "venv", str(venv)], REPO, timeout=120)
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-r", str(projects["minimal"] / "requirements.txt")],
         projects["minimal"], timeout=1800)
    (venv / ".installed").touch()  # what `make setup` leaves: newer than requirements.txt, so make skips setup
    print(f"\nproject venv: {time.monotonic() - start:.0f} s")
    yield venv
    shutil.rmtree(venv, ignore_errors=True)  # gigabytes (torch and its CUDA libraries)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["minimal", "full"])
def test_a_new_project_trains_and_passes_its_own_tests(which: str, projects: dict[str, Path],
                                                       project_venv: Path) -> None:
    project = projects[which]
    log = _run(["git", "log", "--format=%s"], project).splitlines()
    assert len(log) == 1 and f"My {which} project" in log[0]
    assert _run(["git", "status", "--porcelain"], project) == ""
    assert (project / "README.md").read_text().startswith(f"# My {which} project\n")
    files = set(template_files(project))
    assert not files & {"scripts/new_project.py", "project_parts.toml", "docs/benchmarks.md", "scripts/syncbn_benefit.py"}
    assert ({"Dockerfile", "csrc/simt/simt.h", "docs/segmentation.md", "scripts/k8s/trainjob.yaml"} <= files) == (
        which == "full")
    leftovers = [p for p in files if re.search(r"<!--\s*/?part\b|^\s*#\s*/?part\b", (project / p).read_text(
        errors="replace"), re.M)]
    assert not leftovers, f"markers left in {leftovers}"

    (project / ".venv").symlink_to(project_venv, target_is_directory=True)
    # The compiled SyncBN kernels of this session: the project's csrc/ is the template's, so the build is the same.
    env = {**os.environ, "SYNCTRAIN_EXTENSIONS_DIR": str(extensions_dir()), "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "PYTHONPATH", "VIRTUAL_ENV"):
        env.pop(key, None)
    _run(["make", "train", f"ARGS={QUICK_TRAIN}"], project, env)
    assert (project / "outputs" / "smoke" / "checkpoints" / "last.pt").is_file()
    rows = (project / "outputs" / "smoke" / "metrics.jsonl").read_text()
    assert '"step": 2' in rows, rows[-2000:]

    python = str(project / ".venv" / "bin" / "python")
    out = _run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-m", "not slow", *OWN_TESTS],
               project, env)
    assert re.search(r"\d+ passed", out) and " failed" not in out and " error" not in out, out[-3000:]
    out = _run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "--setup-plan"], project, env)
    assert " error" not in out.splitlines()[-1], out[-3000:]
