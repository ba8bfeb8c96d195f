"""The summary a finished run ends with (src/commands/run_summary.py): on the shared classification run, its
paths exist and its evaluate, predict and export commands run as printed. That train.py prints it at the end of a
run is checked by tests/commands/test_train.py's two-process run."""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from PIL import Image

import src.config  # noqa: F401  (registers the tasks)
from src.commands.run_summary import IMAGES, format_summary, read_summary
from src.tasks import get_task
from tests.docs_runner import DocsRunner
from tests.support.trained_runs import copy_run

TIMEOUT_S = 300


def test_the_summary_names_files_that_exist_and_its_commands_run(trained_cls_run: Path, user_runner: DocsRunner,
                                                                  tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = copy_run(trained_cls_run, tmp_path / "run")  # the commands write predictions and model.onnx into it
    task = get_task("classification")
    summary = read_summary(run_dir, task, "top1", wall_s=75.0)
    # The shared run: 64 images, 2 processes x 16 = 2 optimizer steps in one epoch, one evaluation at its end.
    assert (summary.steps, summary.epochs, summary.best[1], summary.last[1]) == (2, 1, 2, 2)
    assert summary.best_checkpoint.is_file() and summary.best_checkpoint.parent == run_dir / "checkpoints"
    monkeypatch.chdir(tmp_path)  # paths below the working folder are shown relative to it, as a user typed them
    text = format_summary(summary, task, workers=2)
    head, best, last, evaluate, predict, export = text.splitlines()
    assert head == "run finished in 1 min 15 s: 2 optimizer steps, 1 epoch(s); run folder run"
    assert best.startswith(f"  best top1 {summary.best[0]:.4g} at step 2: run/checkpoints/best_step0000002_top1")
    assert last == f"  last top1 {summary.last[0]:.4g} at step 2: run/checkpoints/last.pt"
    ckpt = f"ckpt=run/checkpoints/{summary.best_checkpoint.name}"
    assert " --standalone --nproc_per_node=2 " in evaluate and evaluate.endswith(f"evaluate.py {ckpt}")

    images = tmp_path / "photos"
    images.mkdir()
    for i in range(2):
        Image.new("RGB", (40, 30), (60 * i, 120, 200)).save(images / f"photo{i}.png")
    one_process = format_summary(summary, task, workers=1).splitlines()[-3:]
    for line, wrote in zip(one_process, ("", "run/predictions/predictions.csv", "run/model.onnx")):
        command = shlex.split(line.split(":", 1)[1].replace(IMAGES, "photos"))
        assert Path(command[0]).name.startswith("python") and Path(command[1]).is_file(), line
        result = user_runner.run(command[1], command[2:], tmp_path, TIMEOUT_S)  # this test's interpreter
        assert result.returncode == 0, (line, result.output[-3000:])
        assert not wrote or (tmp_path / wrote).is_file(), (line, result.output[-2000:])
