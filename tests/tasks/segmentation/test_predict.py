"""predict.py's segmentation masks from docs/data.md's walk-through (tests/support/own_data.py) against an
independent forward pass at each image's size, and on 2 gloo ranks with nested, clashing and unusual file names
(tolerances: tests/commands/test_predict.py)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from src.data.segmentation.palette import color_palette
from tests.support.gloo import run_on_ranks
from tests.support.own_data import (REPO, THREADS, model_and_config, normalised, reference_forward, tie_gap,
                                    walkthrough)  # noqa: F401

# real torchrun trainings and predictions; reference forwards on one thread (conftest.py)
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


def _check_masks(out: Path, images: Path, relative: list[Path], targets: list[Path], ckpt_path: Path) -> None:
    model, ckpt = model_and_config(ckpt_path)
    amp = ckpt["config"]["trainer"]["amp"]
    palette = color_palette().flatten().tolist()
    for rel, target in zip(relative, targets):
        image = Image.open(images / rel)
        mask = Image.open(out / target)
        assert mask.mode == "P" and mask.size == image.size and mask.getpalette()[:48] == palette[:48]
        logits = reference_forward(model, normalised(image, ckpt["config"]["data"])[None], amp)[0]
        got, ref = torch.from_numpy(np.array(mask)).long(), logits.argmax(0)
        top2 = logits.topk(2, dim=0).values
        differs = got != ref
        gaps = (top2[0] - top2[1])[differs]
        assert (gaps <= tie_gap(top2[0][differs], amp)).all(), (
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
    import src.tasks.segmentation.exports as exports

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
