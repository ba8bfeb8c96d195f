"""Reading image and mask files: a file that cannot be decoded is an error naming it, and the dataset adds
which split and which sample, also when a loader worker read it."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from torch.utils.data import Dataset

from src.data import ClosableLoader
from src.data.image_files import UnreadableImage, load_mask, load_rgb
from src.data.seeded import SeededTransformDataset
from tests.support.unreadable import error_of_loading, expected, truncate


def _image(path: Path, value: int = 90) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(value).integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(path)
    return path


@pytest.mark.parametrize("name", ["a.jpg", "a.png"])
def test_a_truncated_image_or_mask_names_its_file(tmp_path: Path, name: str) -> None:
    path = truncate(_image(tmp_path / name))
    with Image.open(path) as img:
        assert img.size == (64, 48)  # the header is intact: only decoding finds the damage
    with pytest.raises(UnreadableImage, match=f"^cannot read image {path}: ") as info:
        load_rgb(path)
    assert info.value.path == path
    mask = tmp_path / "m.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 3, (48, 64), dtype=np.uint8), mode="L").save(mask)
    with pytest.raises(UnreadableImage, match=f"^cannot read mask {truncate(mask)}: "):
        load_mask(mask)


class _Files(Dataset):
    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        return load_rgb(self.paths[index]), index


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_dataset_adds_the_split_and_the_sample(tmp_path: Path, num_workers: int) -> None:
    paths = [_image(tmp_path / f"{i}.jpg", i) for i in range(4)]
    truncate(paths[2])
    data = SeededTransformDataset(_Files(paths), lambda image, target: (np.asarray(image).shape, target), seed=0,
                                  split="validation split 'val'")
    assert data[1] == ((48, 64, 3), 1)
    loader = ClosableLoader(data, batch_size=1, num_workers=num_workers)
    assert expected(paths[2], "validation split 'val'", 2) in error_of_loading(loader)
