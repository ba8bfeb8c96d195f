"""Tasks: what classification, segmentation, ... each mean to the loop, evaluation and the commands.

Each task is one package here (src/tasks/<task>/) that registers one Task instance and holds its pieces
(src/tasks/base.py is the interface, src/tasks/registry.py the registry, docs/tasks.md the guide). Every
package and module of this one is imported here, so adding a task is adding its package (plus its datasets
and models, registered with its name): no list to extend.
"""
from __future__ import annotations

import importlib
import pkgutil

from src.tasks.base import EvalContext, Evaluator, Task
from src.tasks.registry import all_tasks, get_task, register_task, task_names

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")

__all__ = ["EvalContext", "Evaluator", "Task", "all_tasks", "get_task", "register_task", "task_names"]
