"""`evaluate.py` end to end: it reproduces the validation metrics the trainer logged for the same checkpoint,
alone and under torchrun, for classification (each task's own: tests/tasks/<task>/test_evaluate.py), and exports
complete, ordered predictions.

Real subprocesses (`python train.py`, `torchrun ... evaluate.py`), tiny sizes, one CPU thread each.
Counted metrics (top-1/top-5, the confusion-matrix metrics) must be equal exactly: they are sums of
integers over every sample once, whatever the world size. Float losses are compared to LOSS_RTOL: batch
boundaries move with the world size, and oneDNN picks kernels by batch shape and CPU, so a sample's
logits may differ in the last float32 bits (one ulp is 1.2e-7 relative; an Intel Xeon run differed by
5e-9 relative on the mean loss). A real bug (a sample counted twice, other weights) moves the loss by
far more than 1e-6.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from src.commands.evaluate import run
from src.commands.trained_run import overrides_of
from src.engine.checkpoint.state import model_weights
from tests.support.trained_runs import CLS_VAL_SIZE

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
TIMEOUT_S = 300

LOSS_RTOL = 1e-6
# Keys of a metrics row that are float means, not counts: equal only up to float32 rounding (module docstring).
FLOAT_KEYS = ("loss",)


def run_cmd(args: list[str]) -> str:
    """Run a command from the repository root; fail the test with its output when it fails."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(args)} failed ({proc.returncode}):\n{output[-5000:]}"
    return output


def torchrun(nproc: int, script: str, *args: str) -> str:
    return run_cmd([TORCHRUN, "--standalone", f"--nproc_per_node={nproc}", script, *args])


def last_val_row(run_dir: Path) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    val = [r for r in rows if r["split"] == "val"]
    assert val, f"no val row in {run_dir / 'metrics.jsonl'}"
    return val[-1]


def assert_reproduces(evaluated: dict, logged: dict, prefix: str = "") -> None:
    """Counted metrics equal the trainer's exactly (NaN == NaN for absent classes), losses to LOSS_RTOL."""
    for key, value in evaluated.items():
        if key in ("split", "epoch", "step", "checkpoint", "weights", "world_size"):
            continue
        expected = logged[prefix + key]
        if key in FLOAT_KEYS:
            assert value == pytest.approx(expected, rel=LOSS_RTOL, abs=0.0), (key, value, expected)
        else:
            assert (math.isnan(value) and math.isnan(expected)) or value == expected, (key, value, expected)
    assert evaluated["step"] == logged["step"] and evaluated["epoch"] == logged["epoch"]


@pytest.mark.slow
def test_evaluate_reproduces_logged_classification_metrics(trained_cls_run: Path, tmp_path: Path) -> None:
    """The shared run (tests/support/trained_runs.py): 2 processes with per-rank BN (norm=bn) and an EMA; the
    checkpoint must hold the BN statistics of model and EMA that the logged metrics were computed with (made equal
    across ranks before evaluating)."""
    ckpt = trained_cls_run / "checkpoints" / "last.pt"
    logged = last_val_row(trained_cls_run)
    out = run_cmd([sys.executable, "evaluate.py", f"ckpt={ckpt}", f"out={tmp_path / 'one.json'}",
                   f"export={tmp_path / 'one'}"])
    assert "top1" in out and "metric" in out  # the table
    one = json.loads((tmp_path / "one.json").read_text())
    assert one["world_size"] == 1 and one["weights"] == "model"
    assert set(one) >= {"loss", "top1", "top5"}
    assert_reproduces(one, logged)

    torchrun(2, "evaluate.py", f"ckpt={ckpt}", f"out={tmp_path / 'two.json'}", f"export={tmp_path / 'two'}")
    two = json.loads((tmp_path / "two.json").read_text())
    assert two["world_size"] == 2
    assert_reproduces(two, logged)
    preds_one, preds_two = np.load(tmp_path / "one" / "predictions.npy"), np.load(tmp_path / "two" / "predictions.npy")
    assert preds_one.shape == (CLS_VAL_SIZE,)
    np.testing.assert_array_equal(preds_one, preds_two)
    rows = (tmp_path / "two" / "predictions.csv").read_text().splitlines()[1:]
    assert [int(r.split(",")[0]) for r in rows] == list(range(CLS_VAL_SIZE))


@pytest.mark.slow
@pytest.mark.usefixtures("restores_process_state", "one_thread")  # run() in this process
def test_evaluate_ema_weights_reproduce_logged_ema_metrics(trained_cls_run: Path, tmp_path: Path) -> None:
    """In this process (evaluate.py's main only hands the composed config to run(), which the test above runs as a
    command): `ema=true` evaluates the EMA weights, which the trainer logged as ema_*."""
    logged = last_val_row(trained_cls_run)
    run(_compose(f"ckpt={trained_cls_run / 'checkpoints' / 'last.pt'}", "ema=true", f"out={tmp_path / 'ema.json'}"))
    ema = json.loads((tmp_path / "ema.json").read_text())
    assert ema["weights"] == "ema"
    assert_reproduces(ema, logged, prefix="ema_")
    assert ema["top1"] != logged["top1"] or ema["loss"] != logged["loss"]  # really other weights


def _compose(*overrides: str):
    with initialize_config_dir(str(REPO / "conf"), version_base=None):
        return compose("evaluate", overrides=list(overrides))


@pytest.mark.usefixtures("restores_process_state")  # run() in this process
def test_missing_or_absent_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="ckpt is required: python evaluate.py ckpt="):
        run(_compose())
    with pytest.raises(FileNotFoundError, match="no such file"):
        run(_compose(f"ckpt={tmp_path / 'nope.pt'}"))


@pytest.mark.usefixtures("restores_process_state")  # run() in this process
def test_another_model_or_a_broken_file_is_a_clear_error(tmp_path: Path) -> None:
    from tests.engine.legacy_checkpoint import write_format_v0

    ckpt = tmp_path / "last.pt"
    write_format_v0(ckpt, ["model=resnet20", "data.image_size=16", "trainer.ema=true"], epoch=1, step=4,
                    steps_per_epoch=4)
    with pytest.raises(ValueError, match=rf"weights in {ckpt} do not fit.*model.name=resnet20.*model.name=resnet32"):
        run(_compose(f"ckpt={ckpt}", "+model.name=resnet32", "trainer.num_threads=1", "+data.val_size=8"))
    cut = tmp_path / "cut.pt"
    cut.write_bytes(ckpt.read_bytes()[:1000])
    with pytest.raises(ValueError, match=f"checkpoint {cut} cannot be read"):
        run(_compose(f"ckpt={cut}"))


def test_command_line_overrides_reach_the_training_config() -> None:
    cfg = _compose("ckpt=x.pt", "data.root=/datasets", "data.eval_batch_size=4", "trainer.amp=bf16",
                   "+data.val_size=50")
    assert overrides_of(cfg) == {"data": {"root": "/datasets", "eval_batch_size": 4, "val_size": 50},
                                 "trainer": {"amp": "bf16"}}
    assert overrides_of(_compose("ckpt=x.pt")) == {}


def test_ema_requested_without_ema_weights_is_an_error() -> None:
    with pytest.raises(ValueError, match="x.pt holds no EMA weights"):
        model_weights({"model": {}, "ema": None}, True, "x.pt")
    assert model_weights({"model": {}, "ema": {"module.w": 1, "n_averaged": 3}}, True, "x.pt") == {"w": 1}


