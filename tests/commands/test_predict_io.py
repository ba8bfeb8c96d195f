"""predict.py's file handling: which inputs, in which order, errors (each task's output: tests/tasks/<task>/)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from src.commands.predict import run
from src.commands.predict_io import list_inputs

REPO = Path(__file__).resolve().parents[2]


def _touch(path: Path, data: bytes = b"x") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_folder_inputs_recursive_sorted_hidden_and_own_output_skipped(tmp_path: Path) -> None:
    for name in ("b.jpg", "a.PNG", "sub/c.jpeg", "sub/deeper/d.webp", "notes.txt", ".DS_Store", "._b.jpg",
                 ".ipynb_checkpoints/a.png", "preds/a.png"):
        _touch(tmp_path / name)
    base, files = list_inputs(tmp_path, out_dir=tmp_path / "preds")
    assert base == tmp_path
    assert files == [Path("a.PNG"), Path("b.jpg"), Path("sub/c.jpeg"), Path("sub/deeper/d.webp")]
    # Without out= inside the folder, an earlier run's masks are inputs like any image.
    assert Path("preds/a.png") in list_inputs(tmp_path, out_dir=tmp_path.parent / "elsewhere")[1]


def test_single_file_input_and_missing_or_empty_inputs(tmp_path: Path) -> None:
    _touch(tmp_path / "one photo.HEIC")  # named explicitly: taken as it is, PIL decides
    assert list_inputs(tmp_path / "one photo.HEIC") == (tmp_path, [Path("one photo.HEIC")])
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        list_inputs(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no images found \(looked for .jpg"):
        list_inputs(tmp_path / "empty")


def _compose(*overrides: str):
    with initialize_config_dir(str(REPO / "conf"), version_base=None):
        return compose("predict", overrides=list(overrides))


@pytest.mark.usefixtures("restores_process_state")  # run() in this process
def test_missing_arguments_say_how_to_call_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"ckpt, input, out are required: python predict.py ckpt="):
        run(_compose())
    with pytest.raises(ValueError, match=r"out is required"):
        run(_compose(f"ckpt={tmp_path}/x.pt", f"input={tmp_path}"))
    with pytest.raises(FileNotFoundError, match="ckpt=.*no such file"):
        run(_compose(f"ckpt={tmp_path}/x.pt", f"input={tmp_path}", f"out={tmp_path}/o"))


def test_each_task_reads_its_own_predict_options_and_refuses_the_others() -> None:
    """predict.py's schema holds every task's keys (topk=3 works without `+`); the checkpoint's task gets its own,
    validated, and a key of another task set away from its default is refused."""
    from src.commands.predict import _task_options
    from src.tasks import all_tasks, get_task

    classification = get_task("classification")
    assert _task_options(_compose("topk=3"), classification).topk == 3
    with pytest.raises(ValueError, match="topk must be an integer >= 1, got 0"):
        _task_options(_compose("topk=0"), classification)
    for task in all_tasks():  # another task's keys on a classifier (none in a classification-only project)
        if task.predict_options is None or task is classification:
            continue
        key = dataclasses.fields(task.predict_options)[0]
        value = not key.default if isinstance(key.default, bool) else key.default / 2
        # A key several tasks declare alike is one key, and the message names all its owners (last: whoever they
        # are, the message starts the same).
        with pytest.raises(ValueError, match=rf"{key.name}=.* is not read by this checkpoint's task, classification: "
                                             rf"it is an option of (\w+ and )*{task.name}( and \w+)* predictions"):
            _task_options(_compose(f"{key.name}={str(value).lower()}"), classification)
        with pytest.raises(ValueError, match=f"topk=3 is not read by this checkpoint's task, {task.name}"):
            _task_options(_compose("topk=3"), task)
