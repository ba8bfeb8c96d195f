"""predict.py draw=true for detection, as the report saw it (a 128x96 scene, several classes guessed per object): the
picture is enlarged to a long side of 512 px, holds one labelled box per object in its class's colour (every box with
draw_every_box=true) and a legend of the classes drawn; and the TensorBoard pictures are drawn the same way."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from src.data.batch import Batch
from src.tasks import get_task
from src.tasks.detection.options import DetectionPredict
from src.tasks.pictures import class_colour

# One thread: the drawing is many small tensor operations, which threads only slow down on a busy machine.
pytestmark = pytest.mark.usefixtures("one_thread")

CLASSES = ["background", "circle", "square", "triangle", "star", "cross", "ring"]
HEIGHT, WIDTH, FACTOR = 96, 128, 4  # 4 x 128 = 512


def _guesses() -> dict[str, torch.Tensor]:
    """Two objects, each seen as three classes with nearly the same box: circle 0.9 / square 0.6 / triangle 0.4 on
    the first, star 0.8 / cross 0.5 / ring 0.35 on the second."""
    first, second = torch.tensor([10.0, 30.0, 50.0, 70.0]), torch.tensor([70.0, 20.0, 120.0, 60.0])
    jitter = torch.tensor([[0.0, 0, 0, 0], [1, -1, 1, 2], [-2, 1, 0, -1]])
    return {"boxes": torch.cat([first + jitter, second + jitter]),
            "scores": torch.tensor([0.9, 0.6, 0.4, 0.8, 0.5, 0.35]), "labels": torch.tensor([1, 2, 3, 4, 5, 6])}


def _drawn(tmp_path: Path, every_box: bool) -> torch.Tensor:
    """The picture detection's predict.py writes for a flat grey 128x96 image with those guesses."""
    image = torch.full((3, HEIGHT, WIDTH), 0.4)
    get_task("detection").predict(
        [Batch([image], None, torch.tensor([0]))], lambda batch: [_guesses()], files=[Path("scene.jpg")],
        out_dir=tmp_path, class_names=CLASSES, batch_count=1,
        options=DetectionPredict(score_threshold=0.3, draw=True, draw_every_box=every_box))
    return torch.from_numpy(np.array(Image.open(tmp_path / "boxes" / "scene.png"))).permute(2, 0, 1)


def _coloured(picture: torch.Tensor, colour: tuple[int, int, int]) -> torch.Tensor:
    """[H, W] bool: the pixels of exactly `colour`."""
    return (picture == torch.tensor(colour, dtype=torch.uint8).view(3, 1, 1)).all(0)


def _filled(mask: torch.Tensor) -> bool:
    """Whether `mask` holds a filled 5x5 square somewhere: a label's background (box outlines are 2 px wide)."""
    return bool((-F.max_pool2d(-mask.float()[None, None], 5, stride=1) > 0.5).any())


@pytest.mark.parametrize("every_box", [False, True])
def test_a_small_images_drawn_prediction_is_enlarged_with_one_label_per_object(tmp_path: Path, every_box: bool) -> None:
    picture = _drawn(tmp_path, every_box)
    assert picture.shape[1] == HEIGHT * FACTOR and picture.shape[2] > WIDTH * FACTOR  # the legend on the right
    image, legend = picture[:, :, :WIDTH * FACTOR], picture[:, :, WIDTH * FACTOR:]
    drawn = [1, 2, 3, 4, 5, 6] if every_box else [1, 4]  # one per object: the best of each object's guesses
    for label in range(1, len(CLASSES)):
        colour = class_colour(label)
        on_image = _coloured(image, colour)
        if label in drawn:  # its box and its label (a filled background), and its legend entry
            assert _filled(on_image) and _coloured(legend, colour).any(), CLASSES[label]
        else:
            assert not on_image.any() and not _coloured(legend, colour).any(), CLASSES[label]
    assert (image[:, HEIGHT * FACTOR // 2, 0] == 102).all()  # the image itself (0.4 x 255), untouched beside the boxes


def test_tensorboard_draws_the_validation_images_the_same_way(writer) -> None:
    from src.data.datasets.shapes.datasets import ShapesDetection
    from src.models import build_model

    task = get_task("detection")
    data = ShapesDetection(0, "val", 2, image_size=40, num_shape_kinds=2)
    samples = [(data[i][0].float() / 255, data[i][1]) for i in range(2)]
    task.log_train_samples(writer, [s[0] for s in samples], [s[1] for s in samples], 1, mean=(0,) * 3, std=(1,) * 3)
    model = build_model({"name": "fcos_resnet18", "head_channels": 64}, {"name": "bn"}, 3)
    task.log_eval_pictures(writer, model, samples, 2, torch.device("cpu"), mean=(0,) * 3, std=(1,) * 3, amp="none")
    assert [t for t, _, _ in writer.images] == ["train/samples", "val/detections_0", "val/detections_1"]
    # 40 px enlarged 7 times: a long side of at least 256 px
    assert all(image.dtype == torch.uint8 and image.shape[1] == 280 for _, image, _ in writer.images[1:])
    # the training samples' boxes in their classes' colours
    assert all(_coloured(writer.images[0][1], class_colour(int(c))).any() for c in data[0][1]["labels"])
