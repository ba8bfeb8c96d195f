"""predict.py's file handling: which inputs, in which order, errors (each task's output: tests/tasks/<task>/)."""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from src.commands.predict import run
from src.tasks.predict_io import list_inputs

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


def test_missing_arguments_say_how_to_call_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"ckpt, input, out are required: python predict.py ckpt="):
        run(_compose())
    with pytest.raises(ValueError, match=r"out is required"):
        run(_compose(f"ckpt={tmp_path}/x.pt", f"input={tmp_path}"))
    with pytest.raises(FileNotFoundError, match="ckpt=.*no such file"):
        run(_compose(f"ckpt={tmp_path}/x.pt", f"input={tmp_path}", f"out={tmp_path}/o"))
