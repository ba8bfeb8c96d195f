"""TASKS: every task a dataset or a model can serve, one instance each, and the run's task of a model and a dataset.

The task packages (src/tasks/<task>/, each registering its Task) are imported when the registry is first read
(`load_tasks`), not when src.tasks is: the engine imports the interface, never a task.
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Iterator, Optional, TypeVar

from src.data.registry import DATASETS, dataset_tasks
from src.errors import UserError
from src.models.registry import MODELS, model_output
from src.tasks.base import Task

T = TypeVar("T", bound=Task)

_TASKS: dict[str, Task] = {}
_loaded = False


def load_tasks() -> None:
    """Import every task package of src/tasks/ once (each registers its Task); the readers below call it."""
    global _loaded
    if _loaded:
        return
    _loaded = True  # first: a task package's own imports may read the registry
    import src.tasks as package

    try:
        for module in sorted(m.name for m in pkgutil.iter_modules(package.__path__) if m.ispkg):
            importlib.import_module(f"{package.__name__}.{module}")
    except BaseException:
        _loaded = False  # the next reader tries again (and meets the same error)
        raise


def register_task(task: T) -> T:
    """Add `task` under `task.name` (once); returns it, so a module can keep it as a constant."""
    if not task.name or not task.name.isidentifier():
        raise ValueError(f"a task needs a name that is an identifier, got {task.name!r}")
    if task.name in _TASKS:
        raise ValueError(f"task {task.name!r} is registered twice ({type(_TASKS[task.name]).__module__} and "
                         f"{type(task).__module__})")
    _TASKS[task.name] = task
    return task


def get_task(name: str) -> Task:
    """The registered task `name`; UserError naming every registered task otherwise."""
    load_tasks()
    try:
        return _TASKS[name]
    except KeyError:
        raise UserError(f"task {name!r} is not registered; registered tasks: {', '.join(_TASKS)} (a task is a "
                        "package in src/tasks/: docs/tasks.md, 'Add your own task')") from None


def task_names() -> tuple[str, ...]:
    """Registered task names, in registration order."""
    load_tasks()
    return tuple(_TASKS)


def all_tasks() -> Iterator[Task]:
    """Every registered task."""
    load_tasks()
    return iter(tuple(_TASKS.values()))


def model_tasks(model: str) -> tuple[str, ...]:
    """The tasks `model.name` serves: every registered task that reads what its family produces."""
    output = model_output(model)
    return tuple(task.name for task in all_tasks() if task.model_output == output)


def task_models(task: str) -> tuple[str, ...]:
    """Every `model.name` that serves `task` (whose family produces what it reads), in registration order."""
    return tuple(entry.name for entry in MODELS if task in model_tasks(entry.name))


def resolve_task(model: str, data: str, requested: Optional[str] = None) -> Task:
    """The run's task: the one task `model.name` and `data.name` have in common, or `requested` (the `task` key)
    where several are; UserError naming both when none is, or when `requested` fits neither."""
    served, held = model_tasks(model), dataset_tasks(data)
    common = [name for name in served if name in held]
    pair = f"model.name={model} (serves {_listed(served)}) and data.name={data} (serves {_listed(held)})"
    if requested is not None:
        task = get_task(requested)  # UserError naming the registered tasks
        if task.name not in common:
            fix = (f"use task={' or task='.join(common)}" + (" or leave task unset" if len(common) == 1 else "")
                   if common else f"pick a model and a dataset of {requested}")
            raise UserError(f"task={requested} does not fit {pair}: {fix}")
        return task
    if not common:
        datasets = [d for name in served for d in DATASETS.names(name)]
        models = [m for name in held for m in task_models(name)]
        raise UserError(f"{pair} have no task in common: pick a dataset the model serves "
                        f"(data={','.join(dict.fromkeys(datasets)) or 'none registered'}) or a model of the "
                        f"dataset's tasks (model={','.join(dict.fromkeys(models)) or 'none registered'})")
    if len(common) > 1:
        raise UserError(f"{pair} fit several tasks ({', '.join(common)}): choose one with task=<name>, e.g. "
                        f"task={common[0]}")
    return get_task(common[0])


def _listed(names: tuple[str, ...]) -> str:
    return " and ".join(names) if names else "no registered task"
