"""Tasks: what classification, segmentation, ... each mean to the loop, evaluation and the commands.

Each task is one package here (src/tasks/<task>/) that registers one Task instance and holds its pieces
(src/tasks/base.py is the interface, src/tasks/registry.py the registry, docs/tasks.md the guide). The registry
imports every package of this one when it is first read, so adding a task is adding its package (plus its
datasets, registered with its name): no list to extend. Importing src.tasks imports no task.
"""
from __future__ import annotations

from src.tasks.base import Task
from src.tasks.registry import (all_tasks, get_task, load_tasks, model_tasks, register_task, resolve_task,
                                task_models, task_names)

__all__ = ["Task", "all_tasks", "get_task", "load_tasks", "model_tasks", "register_task", "resolve_task", "task_models",
           "task_names"]
