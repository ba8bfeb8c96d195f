"""The documentation holds: every train.py / evaluate.py / predict.py / export.py command in README.md and
docs/*.md runs, and every file the documentation names exists.

Each documented command runs from a fresh folder of its own, as written, plus (for train.py) its dry run
(validate, build model and data, one batch forward, summary, exit 0: nothing trains) and one thread per process.
The commands run one after another, each in a process forked from one long-lived Python process that has
loaded torch and Hydra but none of the project (tests/docs_worker.py: the script as `__main__`, so Hydra's
command line, composition, sweeps and error report are the real ones, and the process ends through the
interpreter's shutdown), which saves each command the interpreter's, torch's and Hydra's start-up. A command
that hangs, is killed or leaves processes running fails whatever it printed (tests/docs_runner.py). What a
test cannot have is handled as a user would meet it:
- checkpoints (`ckpt=outputs/RUN/...`, `ckpt=...`) are a short real training's, placed at the written path
  (a task's run for the pages and paths its tests/tasks/<task>/docs.py names, the default classification run's
  otherwise);
  `input=` folders and files are written from the embedded shapes data; `demo/` is scripts/make_demo_folders.py's;
- data and weights on disk that no test has (`data.root=/data/imagenet`, `model.backbone_weights=/weights/...`,
  `data.root=my_photos`) must make the command fail, and the failure must name the missing path: a typo in a
  key, a bad value or a crash fails the test. `data.download=true` is turned off (no network here), so the
  command still meets the missing data; pretrained weights by name meet empty library caches (TORCH_HOME,
  HF_HOME: the worker's, which no command may write into) offline, and the failure must name the cache path
  to put the file in;
- torchrun commands run as one plain process (the dry run checks the composition and the build; the world size
  changes only the summary's batch figures); sweeps (`-m`) run as sweeps (Hydra's multirun and basic launcher),
  except a SLURM launcher's, which runs its first combination without the launcher's submission.
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Iterator

import pytest

from tests.docs_commands import DOC_FILES, REPO, DocCommand, documented_commands
from tests.docs_fixtures import build_fixtures, task_recipes
from tests.support.shared_dir import made_once
from tests.docs_runner import DocsRunner, Result

TIMEOUT_S = 300
# Added to every command (nothing documented sets these keys, so they hold). evaluate.py and predict.py run for
# real: on the fixtures they take seconds.
EXTRA = {"train.py": ["trainer.dry_run=true", "trainer.num_threads=1"], "evaluate.py": ["trainer.num_threads=1"],
         "predict.py": ["trainer.num_threads=1"], "export.py": []}
# Keys whose values name files or folders that must exist for the command to do its work.
PATH_KEYS = ("data.root", "model.backbone_weights", "model.weights", "ckpt", "input")
# Files a walk-through tells the user to create; the documentation shows them as examples.
USER_FILES = {"conf/data/mydata.yaml", "src/data/datasets/mydata.py", "conf/model/my_net.yaml", "src/models/my_net.py"}

COMMANDS = documented_commands()
# A command written on several pages runs once, under the first place it appears (the others are listed in the id).
UNIQUE: dict[tuple, list[DocCommand]] = {}
for _command in COMMANDS:
    UNIQUE.setdefault((_command.script, _command.args), []).append(_command)


def _env(cache: Path) -> dict[str, str]:
    """This environment without a surrounding torchrun's variables, one thread, unbuffered output, and empty
    weight caches of the libraries (`cache`): weights by name are not there, and the error must say where to put
    them."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                             "MASTER_PORT", "LOCAL_WORLD_SIZE")}
    # HF_HUB_OFFLINE: pretrained weights by name come from the caches or fail naming the file, never a download.
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TORCH_HOME=str(cache / "torch"),
               HF_HOME=str(cache / "huggingface"))
    return env


@pytest.fixture(scope="module")
def weight_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The libraries' weight caches (TORCH_HOME, HF_HOME) of the commands: empty, and nothing downloads."""
    return tmp_path_factory.mktemp("doc_weight_cache")


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory, weight_cache: Path) -> Iterator[DocsRunner]:
    """Runs the commands in processes forked from one that started once (tests/docs_worker.py); the worker must
    exit cleanly at the end (else the last command fails)."""
    docs_runner = DocsRunner(_env(weight_cache), tmp_path_factory.mktemp("doc_runner_logs"))
    yield docs_runner
    docs_runner.close()


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory, runner: DocsRunner) -> dict[str, Path]:
    """What the documented commands expect to find: a checkpoint per task, demo folders, images."""
    root = made_once(tmp_path_factory, "doc_fixtures", lambda folder: build_fixtures(runner, folder, TIMEOUT_S))
    return {**{task: root / task / "checkpoints" / "last.pt" for task in ("default", *task_recipes())},
            "demo": root / "demo", "images": root / "images"}


def _prepare(command: DocCommand, cwd: Path, fixtures: dict[str, Path]) -> list[str]:
    """The command's arguments with the test's placements made in `cwd`; returns the arguments to run."""
    (cwd / "demo").symlink_to(fixtures["demo"], target_is_directory=True)
    args = []
    for arg in command.args:
        if arg == "<overrides>" or arg in ("-m", "--multirun"):
            continue
        key, _, value = arg.partition("=")
        if key == "data.download":
            arg = "data.download=false"
        elif key == "ckpt":
            page = command.where.split(":")[0]
            task = next((t for t, r in task_recipes().items()
                         if page in r.PAGES or any(hint in value for hint in r.PATH_HINTS)), "default")
            target = cwd / ("ckpt.pt" if value == "..." else value)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(fixtures[task], target)
            arg = f"ckpt={target.relative_to(cwd)}"
        elif key == "trainer.resume" and value not in ("none", "auto") and "<" not in value:
            run = fixtures["default"].parents[1]  # a run folder to continue, or (a .pt) one of its checkpoints
            target = cwd / value
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.suffix == ".pt":
                shutil.copy(fixtures["default"], target)
            else:
                shutil.copytree(run, target)
        elif key == "input" and not (cwd / value).exists():
            if Path(value).suffix:
                (cwd / value).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(next(fixtures["images"].iterdir()), cwd / value)
            else:
                shutil.copytree(fixtures["images"], cwd / value)
        args.append(arg)
    return args


def _argv(command: DocCommand, args: list[str]) -> list[str]:
    """The words after the script: the test's overrides first (Hydra takes none after a flag such as `--cfg job`),
    then the command's. Sweeps run as sweeps (`-m` leads); a cluster launcher's sweep runs its first combination
    here, unsubmitted."""
    if not command.multirun:
        return [*EXTRA[command.script], *args]
    if any(a.startswith("hydra/launcher=") for a in args):
        return [*EXTRA[command.script], *(a if "=" not in a or "[" in a else a.split(",")[0] for a in args)]
    return ["-m", *EXTRA[command.script], *args, "hydra.sweep.dir=multirun"]


def _by_name(command: DocCommand) -> bool:
    """Whether the command asks for pretrained weights by name (timm's pretrained, a torchvision weights enum)."""
    names = [command.value(k) for k in ("model.weights", "model.backbone_weights")]
    return command.value("model.pretrained") == "true" or any(
        v and "/" not in v and not Path(v).suffix for v in names)


def _missing_paths(command: DocCommand, cwd: Path) -> list[str]:
    """Values of the path keys that name nothing on this machine (after the test's placements)."""
    missing = []
    for key in PATH_KEYS:
        value = command.value(key)
        if value and key != "ckpt" and not (cwd / value).exists() and not Path(value).exists():
            missing.append(value.rstrip("/"))
    return missing


@pytest.mark.slow
@pytest.mark.parametrize("command", [same[0] for same in UNIQUE.values()],
                         ids=["+".join(c.where for c in same) for same in UNIQUE.values()])
def test_documented_command_runs(command: DocCommand, fixtures: dict[str, Path], runner: DocsRunner,
                                 weight_cache: Path, tmp_path: Path) -> None:
    """The command runs its dry run to exit 0, or, lacking data or weights no test has, names what is missing."""
    args = _argv(command, _prepare(command, tmp_path, fixtures))
    proc: Result = runner.run(command.script, args, tmp_path, TIMEOUT_S)
    output = proc.output
    # The cache is shared by the worker's commands: a file left there would let a later one pass unchecked.
    left = [str(p) for p in weight_cache.rglob("*") if p.is_file()]
    assert not left, f"{command.where}: `{command.text}` wrote into the empty weight cache: {left}"
    missing = _missing_paths(command, tmp_path) + ([str(weight_cache)] if _by_name(command) else [])
    if proc.returncode == 0:
        return
    assert missing, f"{command.where}: `{command.text}` failed (exit {proc.returncode}):\n{output[-4000:]}"
    assert any(path in output for path in missing), (
        f"{command.where}: `{command.text}` failed without naming the missing {missing}:\n{output[-4000:]}")
    assert not re.search(r"Could not override|not in struct|ConfigCompositionException|Key '.*' is not", output), (
        f"{command.where}: `{command.text}` does not compose:\n{output[-4000:]}")


def test_commands_are_found() -> None:
    """The extraction sees the commands of every page that shows some (a broken parser would pass vacuously)."""
    pages = {c.where.split(":")[0] for c in COMMANDS}
    expected = {"README.md", "docs/training.md", "docs/data.md", "docs/evaluation.md"}
    expected |= {page for recipe in task_recipes().values() for page in recipe.PAGES}
    assert expected <= pages
    assert {"train.py", "evaluate.py", "predict.py"} <= {c.script for c in COMMANDS}


def _named_paths(text: str, page: Path) -> set[str]:
    """Repository paths a page names: markdown links and `src/...`-style paths."""
    names = set()
    for match in re.finditer(r"\]\(([^)#\s]+)", text):
        if "://" not in match.group(1):
            names.add((page.parent / match.group(1)).resolve().relative_to(REPO).as_posix())
    for match in re.finditer(r"(?<![\w./-])((?:src|scripts|conf|tests|docs|csrc|\.ci)/[\w./*<>-]*[\w/*>])", text):
        names.add(match.group(1).rstrip("/"))
    return names


@pytest.mark.parametrize("page", DOC_FILES, ids=[p.name for p in DOC_FILES])
def test_every_named_file_exists(page: Path) -> None:
    """No page points at a file or folder the repository does not have (globs must match something)."""
    wrong = []
    for name in sorted(_named_paths(page.read_text(), page)):
        if name in USER_FILES or "<" in name:
            continue
        if "*" in name:
            if not list(REPO.glob(name)):
                wrong.append(name)
        elif not (REPO / name).exists() and not (REPO / f"{name}.py").exists():
            wrong.append(name)
    assert not wrong, f"{page.relative_to(REPO)} names what the repository does not have: {wrong}"


def test_dotted_module_names_exist() -> None:
    """`src.x.y` names in the documentation are modules of the repository (or attributes of one)."""
    wrong = []
    for page in DOC_FILES:
        for match in re.finditer(r"(?<![\w.])(src(?:\.\w+)+)", page.read_text()):
            parts = match.group(1).split(".")
            deepest = max((k for k in range(1, len(parts) + 1)
                           if REPO.joinpath(*parts[:k]).with_suffix(".py").exists()
                           or (REPO.joinpath(*parts[:k])).is_dir()), default=0)
            if deepest < min(len(parts), 2) or len(parts) - deepest > 2:
                wrong.append(f"{page.name}: {match.group(1)}")
    assert not wrong, wrong
