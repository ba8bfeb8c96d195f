"""docs/data.md's "Train on your own data" walk-through, run as written (shortened) once per test session (also
under pytest-xdist): the folder the tests of predict.py read (tests/commands/test_predict.py and each task's).

The commands come from the fenced block after the marker in docs/data.md, so the documentation cannot drift
from what works. The test appends overrides that make them short (tiny folders, 2 optimizer steps, one
thread per process); Hydra keeps the last value given for a key.
"""
from __future__ import annotations

import csv
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import torch
from PIL import Image
from torchvision.transforms import v2

from src.data import demo_folders
from src.engine.checkpoint.files import load_checkpoint
from tests.support.shared_dir import assert_unchanged, fingerprint, made_once

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "data.md"
TIMEOUT_S = 300
PROB_ATOL = 1e-5  # the tolerances of the predictions against reference forwards: tests/commands/test_predict.py
TIE_REL = {"none": 1e-5, "bf16": 2.0 ** -6}
THREADS = ["trainer.num_threads=1"]
# Appended to the documented commands, by script: small folders, 2 steps, quiet, one thread per process.
SHORTEN = {
    "scripts/make_demo_folders.py": ["--train", "8", "--val", "5"],
    "train.py": ["trainer.epochs=1", "trainer.max_steps=2", "data.batch_size=4", "data.num_workers=0",
                 "trainer.progress_bar=false", "trainer.tensorboard=false", *THREADS],
    "predict.py": ["num_workers=0", *THREADS],
}


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


def _walk(cwd: Path) -> None:
    commands = documented_block("run by tests/commands/test_predict.py")
    # The demo folders, then a training and a prediction on each of them.
    expected = ["make_demo_folders.py"] + ["train.py", "predict.py"] * len(demo_folders.demo_folders())
    assert [Path(a).name for c in commands for a in c if a.endswith(".py")] == expected
    for argv in commands:
        run_documented(argv, cwd)


@pytest.fixture(scope="session")
def walkthrough(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A folder in which every command of the walk-through ran, in order (read-only for the tests)."""
    cwd = made_once(tmp_path_factory, "own_data", _walk)
    before = fingerprint(cwd)
    yield cwd
    assert_unchanged(cwd, before)


def reference_forward(model: torch.nn.Module, images: torch.Tensor, amp: str) -> torch.Tensor:
    """The reference forward, under the checkpoint's autocast like predict.py."""
    context = torch.autocast("cpu", dtype=torch.bfloat16) if amp == "bf16" else torch.autocast("cpu", enabled=False)
    with torch.no_grad(), context:
        out = model(images)
    return (out["out"] if isinstance(out, dict) else out).float()


def tie_gap(top: torch.Tensor, amp: str) -> torch.Tensor:
    """The largest top-2 logit gap that rounding can close (see the module docstring)."""
    return TIE_REL[amp] * torch.as_tensor(top).abs() + 1e-6


def model_and_config(ckpt_path: Path) -> tuple[torch.nn.Module, dict]:
    """The checkpoint's model with nn.BatchNorm2d norms, in eval mode: the reference for predict.py."""
    from src.models import build_model

    ckpt = load_checkpoint(ckpt_path)
    cfg = ckpt["config"]
    norm = {**cfg["norm"], "name": "bn"}
    model = build_model({**cfg["model"], "weights": None, "backbone_weights": None}, norm, len(ckpt["class_names"]))
    model.load_state_dict(ckpt["model"])
    return model.eval(), ckpt


def normalised(image: Image.Image, data: dict, size: int | None = None) -> torch.Tensor:
    """torchvision's own v2 steps (not ours): optional Resize + CenterCrop, scale to [0, 1], normalise."""
    steps = [v2.PILToTensor()]
    if size is not None:
        steps += [v2.Resize(data["resize_size"], antialias=True), v2.CenterCrop(size)]
    steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(data["mean"], data["std"])]
    return v2.Compose(steps)(image.convert("RGB"))


def read_csv(path: Path) -> list[list[str]]:
    with open(path, newline="") as f:
        return list(csv.reader(f))
