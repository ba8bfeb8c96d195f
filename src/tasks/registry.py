"""TASKS: every task a dataset or a model can be registered for, one instance each."""
from __future__ import annotations

from typing import Iterator, TypeVar

from src.tasks.base import Task

T = TypeVar("T", bound=Task)

_TASKS: dict[str, Task] = {}


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
    """The registered task `name`; ValueError naming every registered task otherwise."""
    try:
        return _TASKS[name]
    except KeyError:
        raise ValueError(f"task {name!r} is not registered; registered tasks: {', '.join(_TASKS)} (a task is a "
                         "package in src/tasks/: docs/tasks.md, 'Add your own task')") from None


def task_names() -> tuple[str, ...]:
    """Registered task names, in registration order."""
    return tuple(_TASKS)


def all_tasks() -> Iterator[Task]:
    """Every registered task."""
    return iter(_TASKS.values())
