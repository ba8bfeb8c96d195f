"""data=segfolder on folders shaped like real users' ones: mixed formats and sizes, stray files, and every
mistake the check must name (unpaired files, sizes, values, colour or JPEG masks), also on 2 gloo ranks."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch
from PIL import Image

from src.data import DataConfig
from tests.support.task_data import build_datasets, build_eval_loader, build_train_loader
from src.data.segmentation.palette import save_mask_png
from src.config import data_config
from tests.support.gloo import run_on_ranks
from tests.support.unreadable import error_of_loading, expected, truncate

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def _image(path: Path, w: int, h: int, mode: str = "RGB", seed: int = 0) -> np.ndarray:
    """A random image of `mode` saved at `path` (format from the extension); returns its RGB pixels."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rgb = np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    img = Image.fromarray(rgb).convert(mode)
    img.save(path)
    return np.array(img.convert("RGB"))


def _mask(path: Path, labels: np.ndarray, mode: str = "P") -> None:
    """Save class indices as a palette PNG (P), 8-bit grayscale (L) or equal-channel RGB."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode == "P":
        save_mask_png(path, labels)
    elif mode == "RGB":
        Image.fromarray(np.repeat(labels[..., None], 3, axis=2).astype(np.uint8)).save(path)
    else:
        Image.fromarray(labels.astype(np.uint8), mode="L").save(path)


def _labels(w: int, h: int, values: tuple[int, ...]) -> np.ndarray:
    """Horizontal bands of `values`, one after the other."""
    rows = np.array_split(np.arange(h), len(values))
    out = np.zeros((h, w), dtype=np.uint8)
    for v, r in zip(values, rows):
        out[r] = v
    return out


def write_tree(root: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A small tree as users have them; returns {val image name: (RGB pixels, labels)} for lossless val files."""
    t, v = root / "train", root / "val"
    _image(t / "images" / "a.jpg", 30, 20)
    _mask(t / "masks" / "a.png", _labels(30, 20, (0, 1, 255)))  # palette, with ignore pixels
    _image(t / "images" / "street" / "b.PNG", 25, 35, mode="L", seed=1)  # grayscale image, nested, upper case
    _mask(t / "masks" / "street" / "b.png", _labels(25, 35, (2, 0)), mode="L")
    _image(t / "images" / "c.png", 16, 16, mode="RGBA", seed=2)
    _mask(t / "masks" / "c.png", _labels(16, 16, (1, 2)), mode="RGB")  # grayscale saved as RGB
    # What else lives in real folders: macOS and Jupyter leftovers, notes.
    (t / "images" / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (t / "images" / "._a.jpg").write_bytes(b"\0\5\26\7 not a JPEG")
    _mask(t / "masks" / ".ipynb_checkpoints" / "a.png", _labels(30, 20, (9,)))
    (t / "images" / "notes.txt").write_text("labelled by hand\n")
    kept = {"d.png": (_image(v / "images" / "d.png", 40, 24, seed=3), _labels(40, 24, (0, 2, 1))),
            "e.tif": (_image(v / "images" / "e.tif", 12, 18, seed=4), _labels(12, 18, (255, 1)))}
    _mask(v / "masks" / "d.png", kept["d.png"][1])
    _mask(v / "masks" / "e.png", kept["e.tif"][1], mode="L")
    (root / "classes.txt").write_text("background\ncat\ndog\n")
    return kept


def _cfg(root: Path, **kw: object) -> DataConfig:
    base = dict(name="segfolder", root=str(root), crop_size=16, batch_size=3, eval_batch_size=4, mean=MEAN, std=STD)
    base.update(kw)
    return data_config(**base)  # type: ignore[arg-type]


def test_reads_mixed_formats_sizes_and_skips_stray_files(tmp_path: Path) -> None:
    kept = write_tree(tmp_path)
    cfg = _cfg(tmp_path)
    bundle = build_datasets(cfg, seed=0)
    assert bundle.task == "segmentation" and bundle.class_names == ["background", "cat", "dog"]
    assert (len(bundle.train), len(bundle.val)) == (3, 2)
    x, m, _ = next(iter(build_train_loader(bundle.train, cfg, 0, 1, seed=0)))
    assert x.shape == (3, 3, 16, 16) and m.shape == (3, 16, 16) and m.dtype == torch.int64
    assert set(m.unique().tolist()) <= {0, 1, 2, 255}
    # Evaluation: one image per batch (two sizes), each at its own size, masks and pixels as stored.
    mean, std = torch.tensor(MEAN)[:, None, None], torch.tensor(STD)[:, None, None]
    for (x, m, idx), name in zip(build_eval_loader(bundle.val, cfg, 0, 1), ["d.png", "e.tif"]):
        rgb, labels = kept[name]
        assert x.shape == (1, 3, *labels.shape) and idx.tolist() == [["d.png", "e.tif"].index(name)]
        assert torch.equal(m[0], torch.from_numpy(labels).long())
        assert torch.allclose((x[0] * std + mean) * 255, torch.from_numpy(rgb).permute(2, 0, 1).float(), atol=1e-3)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_image_that_cannot_be_decoded_names_its_file_split_and_sample(tmp_path: Path,
                                                                         num_workers: int) -> None:
    write_tree(tmp_path)
    bad_val = truncate(tmp_path / "val" / "images" / "d.png")  # its header is intact: the build's check passes
    bad_train = truncate(tmp_path / "train" / "images" / "c.png")  # pairs sorted by path: a, c, street/b
    cfg = _cfg(tmp_path, num_workers=num_workers)
    bundle = build_datasets(cfg, seed=0)
    message = error_of_loading(build_eval_loader(bundle.val, cfg, 0, 1))
    assert expected(bad_val, "validation split 'val'", 0) in message
    message = error_of_loading(build_train_loader(bundle.train, cfg, 0, 1, seed=0))
    assert expected(bad_train, "training split 'train'", 1) in message


def test_same_sized_validation_images_are_batched(tmp_path: Path) -> None:
    for split in ("train", "val"):
        for i in range(3):
            _image(tmp_path / split / "images" / f"{i}.png", 20, 10, seed=i)
            _mask(tmp_path / split / "masks" / f"{i}.png", _labels(20, 10, (0, 1)))
    cfg = _cfg(tmp_path, num_classes=2)
    bundle = build_datasets(cfg, seed=0)
    assert bundle.class_names == ["0", "1"]  # numbered: no classes.txt
    assert [tuple(b[0].shape) for b in build_eval_loader(bundle.val, cfg, 0, 1)] == [(3, 3, 10, 20)]


def test_classes_derived_from_the_largest_mask_value(tmp_path: Path) -> None:
    write_tree(tmp_path)
    (tmp_path / "classes.txt").unlink()
    assert build_datasets(_cfg(tmp_path), seed=0).class_names == ["0", "1", "2"]  # 255 is not a class
    assert build_datasets(_cfg(tmp_path, num_classes=5), seed=0).num_classes == 5


def test_mask_suffix(tmp_path: Path) -> None:
    for split in ("train", "val"):
        _image(tmp_path / split / "images" / "x.jpg", 8, 8)
        _mask(tmp_path / split / "masks" / "x_mask.png", _labels(8, 8, (0, 1)))
    assert len(build_datasets(_cfg(tmp_path, mask_suffix="_mask", num_classes=2), seed=0).val) == 1
    with pytest.raises(ValueError, match="without a mask: .*x.jpg"):
        build_datasets(_cfg(tmp_path, num_classes=2), seed=0)


def _rewrite(path: str, labels: np.ndarray, mode: str = "P") -> Callable[[Path], None]:
    return lambda root: _mask(root / path, labels, mode)


MISTAKES: dict[str, tuple[Callable[[Path], None], type, str]] = {
    "missing mask": (lambda r: (r / "train/masks/a.png").unlink(), ValueError,
                     r"1 image\(s\) without a mask: .*train/images/a\.jpg"),
    "extra mask": (_rewrite("val/masks/z.png", _labels(4, 4, (0,))), ValueError,
                   r"1 mask\(s\) without an image: .*val/masks/z\.png"),
    "size": (_rewrite("train/masks/a.png", _labels(20, 30, (0,))), ValueError,
             r"differ in size .*train/masks/a\.png is 20x30 but a\.jpg is 30x20"),
    "value": (_rewrite("train/masks/street/b.png", _labels(25, 35, (0, 7)), mode="L"), ValueError,
              r"classes 0\.\.2 \(named in .*classes\.txt\) nor 255 \(ignore\): .*street/b\.png has \[7\]"),
    "colour mask": (lambda r: Image.new("RGB", (30, 20), (128, 0, 0)).save(r / "train/masks/a.png"), ValueError,
                    r"train/masks/a\.png is a RGB image with colours, not an index mask"),
    "jpeg mask": (lambda r: Image.new("L", (30, 20)).save(r / "train/masks/a.jpg"), ValueError,
                  r"lossy format .*train/masks/a\.jpg"),
    "same name": (lambda r: _image(r / "val/images/d.jpg", 40, 24), ValueError, r"val/images: d\.jpg and d\.png have the same name"),
    "corrupt image": (lambda r: (r / "train/images/a.jpg").write_bytes(b"not a jpeg"), ValueError,
                      r"cannot read image .*train/images/a\.jpg"),
    "classes vs num_classes": (lambda r: None, ValueError, r"data\.num_classes=4 but .*classes\.txt names 3 classes"),
    "no masks folder": (lambda r: __import__("shutil").rmtree(r / "val/masks"), FileNotFoundError,
                        r"segfolder masks not found: expected the folder .*val/masks"),
}


@pytest.mark.parametrize("mistake", MISTAKES)
def test_each_mistake_is_an_error_naming_the_file(tmp_path: Path, mistake: str) -> None:
    write_tree(tmp_path)
    make, kind, pattern = MISTAKES[mistake]
    make(tmp_path)
    with pytest.raises(kind, match=pattern):
        build_datasets(_cfg(tmp_path, num_classes=4 if mistake == "classes vs num_classes" else None), seed=0)


def test_too_many_classes_for_8_bit_masks_is_a_config_error() -> None:
    with pytest.raises(ValueError, match=r"data\.num_classes=300: segfolder masks are 8-bit"):
        data_config(name="segfolder", num_classes=300).validate()


def _build_on_ranks(rank: int, world: int, good: str, bad: str) -> tuple[list[str], int, str]:
    bundle = build_datasets(_cfg(Path(good)), seed=0)
    try:
        build_datasets(_cfg(Path(bad)), seed=0)
        error = ""
    except ValueError as exc:
        error = str(exc)
    return bundle.class_names, len(bundle.val), error


def test_two_ranks_share_the_check_and_fail_together(tmp_path: Path) -> None:
    """Rank 1 reads the last pairs (val/e); a bad value there must stop rank 0 too, with the same message."""
    write_tree(tmp_path / "good")
    write_tree(tmp_path / "bad")
    _mask(tmp_path / "bad" / "val" / "masks" / "e.png", _labels(12, 18, (3,)), mode="L")
    results = run_on_ranks(2, _build_on_ranks, str(tmp_path / "good"), str(tmp_path / "bad"))
    assert results[0][:2] == results[1][:2] == (["background", "cat", "dog"], 2)
    assert results[0][2] == results[1][2] and "val/masks/e.png has [3]" in results[0][2]
