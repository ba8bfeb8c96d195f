"""trainer.dry_run=true: the real build path, one forward, a summary, exit 0, and nothing written to the run dir."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.launch import REPO, TINY, launch


def _written(run_dir: Path) -> list[str]:
    """Files under the run dir other than Hydra's own record of the config (.hydra/)."""
    return sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file() and ".hydra" not in p.parts)


@pytest.mark.parametrize("nproc", [0, pytest.param(2, marks=pytest.mark.slow)])  # 2: torchrun
def test_train_dry_run_builds_forwards_once_summarises_and_writes_nothing(tmp_path: Path, nproc: int) -> None:
    run_dir = tmp_path / "run"
    result = launch(nproc, [*TINY, "norm=syncbn", "data.batch_size=8", "trainer.grad_accum_steps=2", "trainer.dry_run=true",
                            f"hydra.run.dir={run_dir}"], timeout=300)
    assert result.returncode == 0, result.stdout[-4000:]
    world = max(nproc, 1)
    out = result.stdout
    assert out.count("dry run (train.py)") == 1  # rank 0 only
    assert "SyncBatchNorm2d x19" in out  # resnet20's norm layers, converted
    assert f"{world} process(es) on cpu" in out
    assert f"8 per rank, effective {world * 16} = {world} x 8 x 2 accumulation" in out
    micro = 192 // (world * 8)  # TINY's 192 training images in whole micro-batches per rank
    assert f"{micro // 2} optimizer steps ({micro} micro-batches per rank)" in out
    assert str(run_dir) in out
    assert _written(run_dir) == []  # no checkpoints, metrics.jsonl, TensorBoard events or log files


def test_train_dry_run_still_fails_on_a_bad_config(tmp_path: Path) -> None:
    result = launch(0, [*TINY, "trainer.dry_run=true", "trainer.grad_accum_steps=0",
                        f"hydra.run.dir={tmp_path / 'run'}"], timeout=180)
    assert result.returncode != 0
    assert "trainer.grad_accum_steps must be > 0, got 0" in result.stdout


def _compose(name: str, *overrides: str):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(REPO / "conf"), version_base=None):
        return compose(name, overrides=list(overrides))


@pytest.fixture(scope="module")
def syncbn_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.engine.legacy_checkpoint import write_format_v0

    path = tmp_path_factory.mktemp("ckpt") / "last.pt"
    write_format_v0(path, ["model=resnet20", "norm=syncbn", "data.image_size=16", "data.val_size=10"],
                    epoch=1, step=4, steps_per_epoch=4)
    return path


@pytest.mark.usefixtures("restores_process_state")  # run() in this process
def test_evaluate_dry_run_reads_builds_forwards_and_writes_nothing(syncbn_checkpoint: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    from src.commands.evaluate import run

    out, export = tmp_path / "metrics.json", tmp_path / "export"
    metrics = run(_compose("evaluate", f"ckpt={syncbn_checkpoint}", f"out={out}", f"export={export}",
                           "trainer.dry_run=true", "trainer.num_threads=1", "device=cpu"))
    printed = capsys.readouterr().out
    assert metrics == {} and not out.exists() and not export.exists()
    assert "dry run (evaluate.py)" in printed
    assert "trained with norm=syncbn, evaluated with norm=bn" in printed and "BatchNorm2d x19" in printed
    assert "epoch 0, step 4, model weights" in printed and "10 val samples" in printed


@pytest.mark.usefixtures("restores_process_state")  # run() in this process
def test_predict_dry_run_lists_inputs_forwards_one_batch_and_writes_nothing(syncbn_checkpoint: Path,
                                                                             tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture) -> None:
    from PIL import Image

    from src.commands.predict import run

    images = tmp_path / "images"
    images.mkdir()
    for i in range(3):
        Image.new("RGB", (20, 18), (40 * i, 90, 200)).save(images / f"{i}.png")
    out = tmp_path / "out"
    run(_compose("predict", f"ckpt={syncbn_checkpoint}", f"input={images}", f"out={out}", "num_workers=0",
                 "trainer.dry_run=true", "trainer.num_threads=1", "device=cpu"))
    printed = capsys.readouterr().out
    assert not out.exists()
    assert "dry run (predict.py)" in printed and "3 image(s)" in printed
    assert "trained with norm=syncbn, predicting with norm=bn" in printed
