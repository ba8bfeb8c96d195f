"""An image that cannot be decoded ends train.py, evaluate.py and predict.py with an error naming the file, its
split and its sample, with loader workers (num_workers=2) as without, and no loader worker outlives the
command: with the training loader's workers, which ignore SIGTERM (src/engine/preemption.py), the run printed
its error and then never exited (src/data/closable_loader.py says why).

In this process (each command's run(), seconds): the error, and that the command ended its workers itself,
while the error, which holds the loader's iterator, is still alive. As users run them (one subprocess per
command line, killed after TIMEOUT_S, which turns a hang into a failure): that the processes exit, also under
torchrun on every rank (slow).
"""
from __future__ import annotations

import csv
import importlib
import multiprocessing
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from PIL import Image

from src.data.image_files import UnreadableImage
from tests.support import process_state
from tests.support.launch import REPO, launch
from tests.support.unreadable import expected, truncate

TIMEOUT_S = 150  # a 2-process run of this job takes ~20 s on 2 busy cores; a hang is a failure after this
TINY = ["data.image_size=16", "data.resize_size=16", "data.batch_size=2", "data.eval_batch_size=2", "device=cpu",
        "trainer.num_threads=1", "trainer.progress_bar=false"]
TRAIN = ["data=imagefolder", "model=resnet20", "norm=bn", "seed=0", "trainer.epochs=1", "trainer.tensorboard=false",
         *TINY]


def _write_folder(root: Path) -> Path:
    """root/{train,val}/{ant,bee}/<i>.jpg: 4 training and 2 validation images per class, 16x16."""
    rng = np.random.default_rng(0)
    for split, count in (("train", 4), ("val", 2)):
        for label in ("ant", "bee"):
            (root / split / label).mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / label / f"{i}.jpg", quality=95)
    return root


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A folder of good images and a checkpoint trained on it (one optimizer step, in this process)."""
    root = _write_folder(tmp_path_factory.mktemp("images"))
    work = tmp_path_factory.mktemp("run")
    with process_state.restoring():
        _run("train", [*TRAIN, f"data.root={root}", "trainer.max_steps=1", "data.num_workers=0"], work)
    (checkpoint,) = work.glob("outputs/*/checkpoints/last.pt")
    return root, checkpoint


def _run(command: str, overrides: list[str], cwd: Path) -> None:
    """src.commands.<command>.run() on the composed config, from `cwd` (the run dir is outputs/<time> there)."""
    run = importlib.import_module(f"src.commands.{command}").run
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose(command, overrides=overrides)
    os.chdir(cwd)
    run(cfg)


def _fails_naming(command: str, overrides: list[str], cwd: Path, names: str) -> None:
    """Run `command` in this process: it must raise UnreadableImage containing `names`, its workers ended."""
    before = set(multiprocessing.active_children())
    with pytest.raises(UnreadableImage) as error:
        _run(command, overrides, cwd)
    assert names in str(error.value)
    left = [p for p in multiprocessing.active_children() if p not in before]
    assert not left, f"{command} left {len(left)} loader worker(s) running after its error: {left}"


def _copy_with_bad(root: Path, tmp_path: Path, relative: str) -> tuple[Path, Path]:
    copy = Path(shutil.copytree(root, tmp_path / "images"))
    return copy, truncate(copy / relative)


@pytest.mark.usefixtures("restores_process_state")
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("split,relative,index", [("training split 'train'", "train/ant/1.jpg", 1),
                                                  ("validation split 'val'", "val/bee/0.jpg", 2)])
def test_train(healthy: tuple[Path, Path], tmp_path: Path, num_workers: int, split: str, relative: str,
               index: int) -> None:
    root, bad = _copy_with_bad(healthy[0], tmp_path, relative)
    # persistent_workers: the validation loader's workers also live between evaluations.
    _fails_naming("train", [*TRAIN, f"data.root={root}", f"data.num_workers={num_workers}",
                            f"data.persistent_workers={num_workers > 0}"], tmp_path, expected(bad, split, index))


@pytest.mark.usefixtures("restores_process_state")
@pytest.mark.parametrize("num_workers", [0, 2])
def test_evaluate(healthy: tuple[Path, Path], tmp_path: Path, num_workers: int) -> None:
    root, bad = _copy_with_bad(healthy[0], tmp_path, "val/ant/1.jpg")
    _fails_naming("evaluate", [f"ckpt={healthy[1]}", f"data.root={root}", f"data.num_workers={num_workers}"],
                  tmp_path, expected(bad, "validation split 'val'", 1))


@pytest.mark.usefixtures("restores_process_state")
@pytest.mark.parametrize("num_workers", [0, 2])
def test_predict_with_skip_unreadable_false(healthy: tuple[Path, Path], tmp_path: Path, num_workers: int) -> None:
    root, bad = _copy_with_bad(healthy[0], tmp_path, "val/bee/1.jpg")
    source = root / "val"
    _fails_naming("predict", [f"ckpt={healthy[1]}", f"input={source}", f"out={tmp_path / 'out'}",
                              f"num_workers={num_workers}", "skip_unreadable=false"], tmp_path,
                  expected(bad, f"input={source}", 3))


@pytest.mark.usefixtures("restores_process_state")
def test_predict_skips_unreadable_files_and_lists_them(healthy: tuple[Path, Path], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """By default a file that cannot be decoded among good ones is left out, named at the end and listed in
    out/unreadable.csv; the others are predicted."""
    root, _ = _copy_with_bad(healthy[0], tmp_path, "val/bee/1.jpg")
    (root / "val" / "notes.png").write_text("not an image")
    out = tmp_path / "out"
    _run("predict", [f"ckpt={healthy[1]}", f"input={root / 'val'}", f"out={out}", "num_workers=2"], tmp_path)
    with open(out / "predictions.csv", newline="") as f:
        assert [row["file"] for row in csv.DictReader(f)] == ["ant/0.jpg", "ant/1.jpg", "bee/0.jpg"]
    with open(out / "unreadable.csv", newline="") as f:
        listed = list(csv.DictReader(f))
    assert [row["file"] for row in listed] == ["bee/1.jpg", "notes.png"]
    assert "truncated" in listed[0]["error"].lower() and "cannot identify image file" in listed[1]["error"]
    assert "skipped 2 input(s) that cannot be read as images: bee/1.jpg, notes.png;" in capsys.readouterr().out


def _exits_naming(nproc: int, script: str, overrides: list[str], bad: Path, prefix: str = "") -> None:
    """The command fails and prints the bad file's message once (as users run it: a mistake is one line)."""
    result = launch(nproc, overrides, timeout=TIMEOUT_S, script=script, full_error=False)
    assert result.returncode != 0, result.stdout[-3000:]
    assert result.stdout.count(f"{prefix}cannot read image {bad} (") == 1, result.stdout[-3000:]


def test_train_py_with_loader_workers_exits(healthy: tuple[Path, Path], tmp_path: Path) -> None:
    root, bad = _copy_with_bad(healthy[0], tmp_path, "train/bee/2.jpg")
    _exits_naming(0, "train.py", [*TRAIN, f"data.root={root}", "data.num_workers=2",
                                  f"hydra.run.dir={tmp_path / 'run'}"], bad)


@pytest.mark.slow
def test_torchrun_train_and_evaluate_with_loader_workers_exit_on_every_rank(healthy: tuple[Path, Path],
                                                                           tmp_path: Path) -> None:
    root, bad = _copy_with_bad(healthy[0], tmp_path, "train/bee/2.jpg")
    _exits_naming(2, "train.py", [*TRAIN, f"data.root={root}", "data.num_workers=2",
                                  f"hydra.run.dir={tmp_path / 'run'}"], bad)
    bad = truncate(root / "val" / "bee" / "1.jpg")  # rank 1's shard: rank 1 says so at once, rank 0 then fails
    _exits_naming(2, "evaluate.py", [f"ckpt={healthy[1]}", f"data.root={root}", "data.num_workers=2",
                                     "trainer.num_threads=1"], bad, prefix="error (rank 1): ")
