"""The task interface: one registration per task, and no switches on a task's, a model family's or a model's name
outside their owners."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from src.data import DATASETS
from src.models import MODELS
from src.tasks import Task, all_tasks, get_task, model_tasks, task_names
from src.tasks.base import MAX, MIN

REPO = Path(__file__).resolve().parents[2]
# A quoted name compared with == / != or tested with `in (...)`: what switching on a name looks like.
_COMPARED = re.compile(r"""(?:==|!=)\s*(["'][\w.-]+["'])|(["'][\w.-]+["'])\s*(?:==|!=)|\bin\s*([(\[{][^)\]}]*[)\]}])""")


def _compared_names(line: str) -> list[str]:
    return [name for match in _COMPARED.finditer(line) for group in match.groups() if group
            for name in re.findall(r"""["']([\w.-]+)["']""", group)]


def test_no_code_compares_a_task_family_or_model_name_outside_its_owner() -> None:
    """A task's name is compared only in src/tasks/, a model family's or a model's name only in the module that
    registers that family (its registration is where behaviour keyed on it lives)."""
    owners: dict[str, set[Path]] = {name: set() for name in task_names()}  # besides src/tasks/
    for entry in MODELS:
        module = Path(sys.modules[entry.builder.__module__].__file__).resolve()
        for name in (entry.name, entry.info["family"].name):
            owners.setdefault(name, set()).add(module)
    files = [*REPO.glob("*.py"), *REPO.glob("scripts/**/*.py"), *REPO.glob("src/**/*.py")]
    found = [f"{f.relative_to(REPO)}:{n}: {name}: {line.strip()}" for f in files
             for n, line in enumerate(f.read_text().splitlines(), 1) for name in _compared_names(line)
             if name in owners and f.resolve() not in owners[name]
             and not (name in task_names() and "tasks" in f.relative_to(REPO).parts)]
    assert len(files) > 50 and {"classification", "cifar_resnet", "resnet20", "timm"} <= set(owners), owners
    assert not found, "\n".join(found)


def test_the_name_check_finds_what_it_forbids() -> None:
    lines = ['if family == "timm":', "x = cfg.name != 'resnet20'", 'if task.name in ("classification", "x"):',
             "a == b", 'print("timm")']
    assert [_compared_names(line) for line in lines] == [["timm"], ["resnet20"], ["classification", "x"], [], []]


def test_every_dataset_and_model_serves_a_registered_task_with_its_data_handling() -> None:
    for entry in DATASETS:
        assert entry.tasks and all(get_task(task).name == task for task in entry.tasks)
    for entry in MODELS:
        assert model_tasks(entry.name), f"model.name={entry.name} serves no registered task"
    for task in all_tasks():
        assert task.data.task == task.name and task.metrics and task.model_output
    with pytest.raises(ValueError, match=r"task .depth. is not registered; registered tasks: .*classification"):
        get_task("depth")


def test_each_metric_goes_the_way_its_task_declares_whatever_its_name() -> None:
    class Keypoints(Task):  # not registered: a task whose falling metric is not named "*loss"
        name = "keypoints"
        metrics = {"nme": MIN, "pck": MAX}
        per_class_prefix, per_class_direction = "nme_", MIN

    task = Keypoints()
    assert [task.higher_is_better(m) for m in ("nme", "ema_nme", "pck", "nme_wrist", "ema_nme_wrist")] == [
        False, False, True, False, False]
    with pytest.raises(ValueError, match="'loss' is not a keypoints metric; its metrics: nme, pck, nme_<class name>"):
        task.higher_is_better("loss")
    for registered in all_tasks():
        assert set(registered.metrics.values()) <= {MAX, MIN} and registered.default_metric in registered.metrics


def test_importing_the_engine_or_the_config_imports_no_task() -> None:
    """The task packages load when the registry is first read, and the config schema is built then, not at import."""
    import subprocess
    import sys

    code = ("import importlib, pkgutil, sys, src.engine, src.config\n"
            "for m in pkgutil.walk_packages(src.engine.__path__, 'src.engine.'): importlib.import_module(m.name)\n"
            "before = sorted(m for m in sys.modules if m.startswith('src.tasks.'))\n"
            "src.config.train_schema()\n"
            "print(before, 'src.tasks.classification' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["['src.tasks.base',", "'src.tasks.registry']", "True"], out.stdout


def test_a_task_adds_its_hooks_after_its_evaluation_and_before_the_checkpoint(tmp_path: Path) -> None:
    from src.commands.train import build_hooks
    from src.config import validate_config
    from src.engine.tracking import Tracker

    marker = object()

    class WithHooks(Task):  # not registered: only its members are read
        name, metrics = "with_hooks", {"loss": MIN}

        def train_hooks(self, config: object, *, writer: object) -> list[object]:
            assert writer is None and config.data.name == "shapes"
            return [marker]

    hooks = build_hooks(validate_config({}), WithHooks(), None, [], Tracker(tmp_path, enabled=False, tensorboard=False),
                        torch.device("cpu"))
    kinds = [type(h).__name__ for h in hooks]
    assert kinds.index("EvalHook") < hooks.index(marker) < kinds.index("CheckpointHook"), kinds


def test_evaluation_runs_the_tasks_evaluation_forward() -> None:
    from src.evaluation.loop import evaluate

    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    class Doubled(Task):  # the model's outputs, doubled: what the evaluator must receive
        name = "doubled"

        def eval_forward(self, module: torch.nn.Module, images: torch.Tensor) -> torch.Tensor:
            return 2 * module(images)

        def evaluator(self, context: object) -> object:
            class Keep:
                def process(self, outputs: torch.Tensor, targets: torch.Tensor, indices: torch.Tensor) -> None:
                    seen.append((outputs, indices))

                def compute(self) -> dict[str, float]:
                    return {"n": float(sum(len(i) for _, i in seen))}
            return Keep()

    model = torch.nn.Linear(3, 2)
    batches = [(torch.randn(4, 3), torch.zeros(4), torch.arange(4))]
    assert evaluate(model, batches, Doubled(), 2, "cpu") == {"n": 4.0}
    with pytest.raises(TypeError, match=r"get_task\('doubled'\)"):  # evaluation looks no task name up
        evaluate(model, batches, "doubled", 2, "cpu")
    with torch.no_grad():
        torch.testing.assert_close(seen[0][0], 2 * model(batches[0][0]))
