"""docs/data.md's "Train on your own data" walk-through, run as written (shortened), and predict.py checked
against an independent forward pass; also under torchrun / 3 gloo ranks, where each input is predicted once.

The commands come from the fenced block after the marker in docs/data.md, so the documentation cannot drift
from what works. The test appends overrides that make them short (tiny folders, 2 optimizer steps, one
thread per process); Hydra keeps the last value given for a key.

Tolerances: the reference forward below runs the same model on the same pixels (one thread, the checkpoint's
autocast), but in another process and batch composition, so logits can differ in their last bits (oneDNN
picks kernels by batch shape). Probabilities are compared to PROB_ATOL = 1e-5 (float32 softmax rounding is
~1e-7; the CSV rounds to 1e-6). A predicted class may differ from the reference only where the reference's
top two logits are within a few rounding steps of each other: TIE_REL x |top logit| + 1e-6, with TIE_REL
1e-5 in float32 (~80 float32 ulps) and 2^-6 under bf16 autocast (the segmentation recipe's: 4 steps of bf16's
8-bit mantissa). Measured: no pixel and no class differed at all. A real bug, such as another transform,
resizing or model, moves logits by far more.
"""
from __future__ import annotations

import csv
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import v2

from src.engine.checkpoint.files import atomic_write_bytes, load_checkpoint, serialize
from src.data.palette import color_palette
from tests.support.gloo import run_on_ranks

# real torchrun trainings and predictions; reference forwards on one thread (conftest.py)
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "data.md"
TIMEOUT_S = 300
PROB_ATOL = 1e-5
TIE_REL = {"none": 1e-5, "bf16": 2.0 ** -6}
THREADS = ["trainer.num_threads=1"]
# Appended to the documented commands, by script: small folders, 2 steps, quiet, one thread per process.
SHORTEN = {
    "scripts/make_demo_folders.py": ["--train-per-class", "4", "--val-per-class", "2"],
    "train.py": ["trainer.epochs=1", "trainer.max_steps=2", "data.batch_size=4", "data.num_workers=0",
                 "trainer.progress_bar=false", "trainer.tensorboard=false", *THREADS],
    "predict.py": ["num_workers=0", *THREADS],
}
# The walk-through's scripts, in order: the demo folders, then a training and a prediction per task.
WALKTHROUGH = ["make_demo_folders.py", "train.py", "predict.py"]
# part: segmentation
SHORTEN["scripts/make_demo_folders.py"] += ["--train-images", "8", "--val-images", "5"]
WALKTHROUGH += ["train.py", "predict.py"]
# /part


def documented_block(marker: str) -> list[list[str]]:
    """The commands of the first ```bash block after `marker` in docs/data.md (continuations joined)."""
    text = DOC.read_text()
    start = text.index("```bash", text.index(marker)) + len("```bash")
    block = text[start:text.index("```", start)].replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.split("#")[0].strip()]


def run_documented(argv: list[str], cwd: Path) -> str:
    """Run one documented command from `cwd`, with the repository's scripts and the test's shortening."""
    script_at = next(i for i, a in enumerate(argv) if a.endswith(".py"))
    script = argv[script_at]
    launcher = [sys.executable] if argv[0] == "python" else [sys.executable, "-m", "torch.distributed.run"]
    full = [*launcher, *argv[1:script_at], str(REPO / script), *argv[script_at + 1:], *SHORTEN[script]]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run(full, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"documented command failed: {shlex.join(argv)}\n{output[-5000:]}"
    return output


@pytest.fixture(scope="module")
def walkthrough(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh folder in which every command of the walk-through ran, in order."""
    cwd = tmp_path_factory.mktemp("own_data")
    commands = documented_block("run by tests/commands/test_predict.py")
    assert [Path(a).name for c in commands for a in c if a.endswith(".py")] == WALKTHROUGH
    for argv in commands:
        run_documented(argv, cwd)
    return cwd


def _forward(model: torch.nn.Module, images: torch.Tensor, amp: str) -> torch.Tensor:
    """The reference forward, under the checkpoint's autocast like predict.py."""
    context = torch.autocast("cpu", dtype=torch.bfloat16) if amp == "bf16" else torch.autocast("cpu", enabled=False)
    with torch.no_grad(), context:
        out = model(images)
    return (out["out"] if isinstance(out, dict) else out).float()


def _tie(top: torch.Tensor, amp: str) -> torch.Tensor:
    """The largest top-2 logit gap that rounding can close (see the module docstring)."""
    return TIE_REL[amp] * torch.as_tensor(top).abs() + 1e-6


def _model_and_config(ckpt_path: Path) -> tuple[torch.nn.Module, dict]:
    """The checkpoint's model with nn.BatchNorm2d norms, in eval mode: the reference for predict.py."""
    from src.models import build_model

    ckpt = load_checkpoint(ckpt_path)
    cfg = ckpt["config"]
    norm = {**cfg["norm"], "name": "bn"}
    model = build_model({**cfg["model"], "weights": None, "backbone_weights": None}, norm, len(ckpt["class_names"]))
    model.load_state_dict(ckpt["model"])
    return model.eval(), ckpt


def _normalised(image: Image.Image, data: dict, size: int | None = None) -> torch.Tensor:
    """torchvision's own v2 steps (not ours): optional Resize + CenterCrop, scale to [0, 1], normalise."""
    steps = [v2.PILToTensor()]
    if size is not None:
        steps += [v2.Resize(data["resize_size"], antialias=True), v2.CenterCrop(size)]
    steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(data["mean"], data["std"])]
    return v2.Compose(steps)(image.convert("RGB"))


def _read_csv(path: Path) -> list[list[str]]:
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_classification_predictions_match_a_reference_forward(walkthrough: Path) -> None:
    val = walkthrough / "demo" / "classify" / "val"
    rows = _read_csv(walkthrough / "outputs" / "demo_classify" / "predictions" / "predictions.csv")
    model, ckpt = _model_and_config(walkthrough / "outputs" / "demo_classify" / "checkpoints" / "last.pt")
    names, data = ckpt["class_names"], ckpt["config"]["data"]
    k = min(5, len(names))
    assert rows[0] == ["file"] + [f"{c}_{i}" for i in range(1, k + 1) for c in ("class", "prob")]
    files = sorted(p.relative_to(val).as_posix() for p in val.rglob("*.jpg"))
    assert [r[0] for r in rows[1:]] == files  # every image once, in sorted order, from 2 processes
    batch = torch.stack([_normalised(Image.open(val / f), data, data["image_size"]) for f in files])
    amp = ckpt["config"]["trainer"]["amp"]
    logits = _forward(model, batch, amp)
    probs = logits.softmax(1)
    for row, p, lg in zip(rows[1:], probs, logits):
        got_names, got_probs = row[1::2], [float(x) for x in row[2::2]]
        top = p.topk(k)
        assert got_probs == pytest.approx(top.values.tolist(), abs=PROB_ATOL)
        assert got_probs == sorted(got_probs, reverse=True)
        for rank, (name, c) in enumerate(zip(got_names, top.indices.tolist())):
            if name != names[c]:  # only a near-tie may swap two classes
                assert abs(lg[names.index(name)] - lg[c]) <= _tie(lg[c], amp), (row, rank)


# part: segmentation
def _check_masks(out: Path, images: Path, relative: list[Path], targets: list[Path], ckpt_path: Path) -> None:
    model, ckpt = _model_and_config(ckpt_path)
    amp = ckpt["config"]["trainer"]["amp"]
    palette = color_palette().flatten().tolist()
    for rel, target in zip(relative, targets):
        image = Image.open(images / rel)
        mask = Image.open(out / target)
        assert mask.mode == "P" and mask.size == image.size and mask.getpalette()[:48] == palette[:48]
        logits = _forward(model, _normalised(image, ckpt["config"]["data"])[None], amp)[0]
        got, ref = torch.from_numpy(np.array(mask)).long(), logits.argmax(0)
        top2 = logits.topk(2, dim=0).values
        differs = got != ref
        gaps = (top2[0] - top2[1])[differs]
        assert (gaps <= _tie(top2[0][differs], amp)).all(), (
            f"{target}: {int(differs.sum())} pixels differ, top-2 gaps {gaps.tolist()[:5]}")
        assert int(got.max()) < len(ckpt["class_names"])


def test_segmentation_masks_match_a_reference_forward_at_each_image_size(walkthrough: Path) -> None:
    images = walkthrough / "demo" / "segment" / "val" / "images"
    out = walkthrough / "outputs" / "demo_segment" / "masks"
    relative = sorted(p.relative_to(images) for p in images.iterdir())
    assert sorted(p.relative_to(out) for p in out.rglob("*.png")) == [r.with_suffix(".png") for r in relative]
    assert len({Image.open(images / r).size for r in relative}) > 1  # the demo's images differ in size
    _check_masks(out, images, relative, [r.with_suffix(".png") for r in relative],
                 walkthrough / "outputs" / "demo_segment" / "checkpoints" / "last.pt")


def _predict_on_ranks(rank: int, world: int, ckpt: str, source: str, out: str) -> None:
    from hydra import compose, initialize_config_dir

    import src.commands.predict as predict
    import src.tasks.exports as exports

    # Several gather rounds with a handful of images. Put back afterwards: the rank's process is reused
    # by later tests (tests/support/gloo.py), which reset its environment and torch state, not module constants.
    saved, exports.MASKS_PER_ROUND = exports.MASKS_PER_ROUND, 2
    try:
        with initialize_config_dir(str(REPO / "conf"), version_base=None):
            cfg = compose("predict", overrides=[f"ckpt={ckpt}", f"input={source}", f"out={out}", "num_workers=0",
                                                *THREADS])
        predict.run(cfg)
    finally:
        exports.MASKS_PER_ROUND = saved


def test_two_ranks_predict_nested_and_clashing_names_once_each(walkthrough: Path, tmp_path: Path) -> None:
    """7 inputs on 2 ranks (shards 4 and 3, gathered in rounds of 2, the last one uneven): same-named files in
    sub-folders, a.jpg next to a.png, upper-case and BMP files."""
    val = walkthrough / "demo" / "segment" / "val" / "images"
    src_images = sorted(val.iterdir())
    layout = {"a.jpg": 0, "a.png": 1, "day1/x.jpg": 2, "day2/x.jpg": 3, "day2/deeper/y.JPG": 4, "z.jpeg": 0,
              "zz.bmp": 2}
    source = tmp_path / "in"
    for rel, i in layout.items():
        (source / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.open(src_images[i]).convert("RGB").save(source / rel)
    ckpt = walkthrough / "outputs" / "demo_segment" / "checkpoints" / "last.pt"
    out = tmp_path / "out"
    run_on_ranks(2, _predict_on_ranks, str(ckpt), str(source), str(out))
    relative = sorted(Path(r) for r in layout)
    expected = ["a.jpg.png", "a.png.png", "day1/x.png", "day2/deeper/y.png", "day2/x.png", "z.png", "zz.png"]
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == expected
    # Sorted inputs and their masks pair up in this order: a.jpg, a.png, day1/x, day2/deeper/y, day2/x, z, zz.
    _check_masks(out, source, relative, [Path(e) for e in expected], ckpt)
# /part


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
    rows = _read_csv(tmp_path / "o" / "predictions.csv")
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
