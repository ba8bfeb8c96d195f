"""The task interface: one registration per task, and no task switches outside the task modules."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from src.data import DATASETS
from src.models import MODELS
from src.tasks import Task, all_tasks, get_task, task_names
from src.tasks.base import MAX, MIN

REPO = Path(__file__).resolve().parents[2]


def test_no_code_outside_the_task_modules_compares_a_task_name() -> None:
    names = "|".join(map(re.escape, task_names()))
    quoted = rf"""["']({names})["']"""
    switch = re.compile(rf"""(==|!=)\s*{quoted}|{quoted}\s*(==|!=)|\bin\s*[(\[{{][^)\]}}]*{quoted}""")
    files = [*REPO.glob("*.py"), *REPO.glob("scripts/**/*.py"), *REPO.glob("src/**/*.py")]
    found = [f"{f.relative_to(REPO)}:{n}: {line.strip()}" for f in files if "tasks" not in f.relative_to(REPO).parts
             for n, line in enumerate(f.read_text().splitlines(), 1) if switch.search(line)]
    assert len(files) > 50 and not found, "\n".join(found)


def test_every_dataset_and_model_names_a_registered_task_with_its_data_handling() -> None:
    for entry in (*DATASETS, *MODELS):
        assert get_task(entry.task).name == entry.task
    for task in all_tasks():
        assert task.data.task == task.name and task.metrics
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
