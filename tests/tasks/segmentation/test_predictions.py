"""predict.py's segmentation output names: one mask per input, never two on one path."""
from __future__ import annotations

from pathlib import Path

import pytest

from src.tasks.segmentation.predictions import mask_names


def test_mask_names_keep_folders_and_never_collide() -> None:
    rel = [Path("a.jpg"), Path("a.png"), Path("x/a.jpg"), Path("y/a.jpg"), Path("z/b.tif")]
    names = mask_names(rel)
    assert names == [Path("a.jpg.png"), Path("a.png.png"), Path("x/a.png"), Path("y/a.png"), Path("z/b.png")]
    assert len(set(names)) == len(names)


@pytest.mark.usefixtures("one_thread")  # many small tensor operations, which threads only slow down when busy
def test_draw_writes_each_input_enlarged_with_its_mask_over_it(tmp_path: Path) -> None:
    """draw=true: out/overlays/<name>.png, the input as it was before normalisation, enlarged to a long side of 512 px
    (8 x 64), the background left clear, the other class laid over it, and a legend; the mask PNG as without."""
    import numpy as np
    import torch
    from PIL import Image

    from src.data.batch import Batch
    from src.tasks import get_task
    from src.tasks.pictures import class_colour
    from src.tasks.segmentation.options import SegmentationPredictSettings

    pixels = torch.randint(0, 256, (3, 40, 64), generator=torch.Generator().manual_seed(0)).to(torch.uint8)
    mean, std = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)
    normalised = (pixels / 255 - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1)
    logits = torch.zeros(1, 3, 40, 64)
    logits[0, 2, 10:30, 20:50] = 1.0  # class 2 ("square") in a block, background elsewhere
    get_task("segmentation").predict(
        [Batch(normalised[None], None, torch.tensor([0]))], lambda batch: logits, files=[Path("d/a.jpg")],
        out_dir=tmp_path, class_names=["background", "circle", "square"], batch_count=1,
        options=SegmentationPredictSettings(draw=True, mean=mean, std=std))
    assert np.array_equal(np.array(Image.open(tmp_path / "d" / "a.png")), logits[0].argmax(0).numpy())
    drawn = torch.from_numpy(np.array(Image.open(tmp_path / "overlays" / "d" / "a.png"))).permute(2, 0, 1)
    assert drawn.shape[1] == 320 and drawn.shape[2] > 512
    assert (drawn[:, :80, :512].int() - pixels[:, :10].repeat_interleave(8, 1).repeat_interleave(8, 2)).abs().max() <= 1
    colour = torch.tensor(class_colour(2)).view(3, 1, 1)
    inside = drawn[:, 96:224, 176:384].int()  # well inside the block: 8 x [12:28, 22:48]
    beneath = pixels[:, 12:28, 22:48].repeat_interleave(8, 1).repeat_interleave(8, 2).int()
    assert ((inside - (beneath + colour) / 2).abs() <= 1).all()
    assert (drawn[:, :, 512:] == colour.to(torch.uint8)).all(0).any()  # the legend's swatch
