"""trainer.dry_run=true: the real build path, one forward, a summary, exit 0, and nothing written to the run dir."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_train import TINY, launch


def _written(run_dir: Path) -> list[str]:
    """Files under the run dir other than Hydra's own record of the config (.hydra/)."""
    return sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file() and ".hydra" not in p.parts)


@pytest.mark.parametrize("nproc", [0, 2])
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
