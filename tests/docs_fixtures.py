"""What the documented commands expect to find (tests/test_docs.py): checkpoints of every task from short real
trainings, the demo folders, a few new images (tests/test_docs.py makes them once per session)."""
from __future__ import annotations

import importlib
import shutil
from pathlib import Path
from types import ModuleType

from tests.docs_runner import DocsRunner

ONE_THREAD = ["trainer.num_threads=1"]
TESTS = Path(__file__).resolve().parent


def _train_checkpoint(runner: DocsRunner, root: Path, name: str, overrides: list[str], timeout_s: float) -> None:
    """A short real training run into root/name (2 optimizer steps, EMA on, so `ema=true` commands have weights)."""
    run_dir = root / name
    proc = runner.run("train.py", [*overrides, "trainer.max_steps=2", "trainer.epochs=1", "trainer.ema=true",
                                   "data.num_workers=0", "trainer.progress_bar=false", *ONE_THREAD,
                                   f"hydra.run.dir={run_dir}"], root, timeout_s)
    assert proc.returncode == 0, proc.output[-6000:]


def task_recipes() -> dict[str, ModuleType]:
    """Each task's tests/tasks/<task>/docs.py (CHECKPOINT, PAGES, PATH_HINTS), by task: its documentation's
    commands get that checkpoint; the others get the default (classification) run's."""
    return {path.parent.name: importlib.import_module(f"tests.tasks.{path.parent.name}.docs")
            for path in sorted((TESTS / "tasks").glob("*/docs.py"))}


def build_fixtures(runner: DocsRunner, root: Path, timeout_s: float) -> None:
    """Each task's checkpoint (the default run's in root/default), the demo folders and a few images under `root`."""
    small = ["data.train_size=16", "data.val_size=8", "data.batch_size=4", "data.eval_batch_size=4"]
    _train_checkpoint(runner, root, "default", small, timeout_s)
    for task, recipe in task_recipes().items():
        _train_checkpoint(runner, root, task, [recipe.CHECKPOINT[0], *small, *recipe.CHECKPOINT[1:]], timeout_s)
    demo_args = [str(root / "demo"), "--train", "32", "--val", "3"]  # per class for the class folders
    demo = runner.run("scripts/make_demo_folders.py", demo_args, root, timeout_s)
    assert demo.returncode == 0, demo.output[-3000:]
    images = root / "images"  # new images for predict.py: a few of the demo's validation JPEGs
    images.mkdir()
    for i, image in enumerate(sorted((root / "demo" / "classify" / "val").rglob("*.jpg"))[:3]):
        shutil.copy(image, images / f"img{i}.jpg")
