"""docs/data.md's "Train on your own data" walk-through, run as written (shortened, tests/support/own_data.py), and
predict.py's classification table checked against an independent forward pass (each task's own predictions:
tests/tasks/<task>/); the documented multirun.

Tolerances: the reference forward (tests/support/own_data.py) runs the same model on the same pixels (one thread, the checkpoint's
autocast), but in another process and batch composition, so logits can differ in their last bits (oneDNN
picks kernels by batch shape). Probabilities are compared to PROB_ATOL = 1e-5 (float32 softmax rounding is
~1e-7; the CSV rounds to 1e-6). A predicted class may differ from the reference only where the reference's
top two logits are within a few rounding steps of each other: TIE_REL x |top logit| + 1e-6, with TIE_REL
1e-5 in float32 (~80 float32 ulps) and 2^-6 under bf16 autocast (the segmentation recipe's: 4 steps of bf16's
8-bit mantissa). Measured: no pixel and no class differed at all. A real bug, such as another transform,
resizing or model, moves logits by far more.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

from src.engine.checkpoint.files import atomic_write_bytes, load_checkpoint, serialize
from tests.support.own_data import (PROB_ATOL, REPO, THREADS, documented_block, model_and_config, normalised,
                                    read_csv, reference_forward, run_documented, tie_gap, walkthrough)  # noqa: F401

# real torchrun trainings and predictions; reference forwards on one thread (conftest.py)
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


def test_classification_predictions_match_a_reference_forward(walkthrough: Path) -> None:
    val = walkthrough / "demo" / "classify" / "val"
    rows = read_csv(walkthrough / "outputs" / "demo_classify" / "predictions" / "predictions.csv")
    model, ckpt = model_and_config(walkthrough / "outputs" / "demo_classify" / "checkpoints" / "last.pt")
    names, data = ckpt["class_names"], ckpt["config"]["data"]
    k = min(5, len(names))
    assert rows[0] == ["file"] + [f"{c}_{i}" for i in range(1, k + 1) for c in ("class", "prob")]
    files = sorted(p.relative_to(val).as_posix() for p in val.rglob("*.jpg"))
    assert [r[0] for r in rows[1:]] == files  # every image once, in sorted order, from 2 processes
    batch = torch.stack([normalised(Image.open(val / f), data, data["image_size"]) for f in files])
    amp = ckpt["config"]["trainer"]["amp"]
    logits = reference_forward(model, batch, amp)
    probs = logits.softmax(1)
    for row, p, lg in zip(rows[1:], probs, logits):
        got_names, got_probs = row[1::2], [float(x) for x in row[2::2]]
        top = p.topk(k)
        assert got_probs == pytest.approx(top.values.tolist(), abs=PROB_ATOL)
        assert got_probs == sorted(got_probs, reverse=True)
        for rank, (name, c) in enumerate(zip(got_names, top.indices.tolist())):
            if name != names[c]:  # only a near-tie may swap two classes
                assert abs(lg[names.index(name)] - lg[c]) <= tie_gap(lg[c], amp), (row, rank)


@pytest.mark.usefixtures("restores_process_state")  # run() in this process
def test_checkpoint_without_class_names_predicts_numbered_classes(walkthrough: Path, tmp_path: Path) -> None:
    from hydra import compose, initialize_config_dir

    from src.commands.predict import run

    ckpt = load_checkpoint(walkthrough / "outputs" / "demo_classify" / "checkpoints" / "last.pt")
    del ckpt["class_names"]  # as written before checkpoints stored them
    atomic_write_bytes(serialize(ckpt), tmp_path / "old.pt")
    one = next((walkthrough / "demo" / "classify" / "val").rglob("*.jpg"))
    with initialize_config_dir(str(REPO / "conf"), version_base=None):
        cfg = compose("predict", overrides=[f"ckpt={tmp_path / 'old.pt'}", f"input={one}", f"out={tmp_path / 'o'}",
                                            "topk=10", "num_workers=0", *THREADS])
    run(cfg)
    rows = read_csv(tmp_path / "o" / "predictions.csv")
    assert len(rows) == 2 and rows[1][0] == one.name
    assert sorted(rows[1][1::2]) == [str(i) for i in range(6)]  # topk=10 capped at the 6 classes


def test_documented_multirun(tmp_path: Path) -> None:
    """The -m example: one job per value, each with its run folder under hydra.sweep.dir."""
    (argv,) = [c for c in documented_block("### Try several settings at once") if "-m" in c]
    run_documented([*argv, "data.val_size=50", "data.train_size=128", "data.batch_size=64",
                    f"hydra.sweep.dir={tmp_path / 'sweep'}"], REPO)
    for job, lr in ((0, 0.05), (1, 0.2)):
        ckpt = load_checkpoint(tmp_path / "sweep" / str(job) / "checkpoints" / "last.pt")
        assert ckpt["config"]["optim"]["lr"] == lr
        assert (tmp_path / "sweep" / str(job) / "metrics.jsonl").is_file()
    assert (tmp_path / "sweep" / "multirun.yaml").is_file()
