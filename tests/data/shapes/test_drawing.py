"""The procedural generator: deterministic, distinct, balanced, and not solvable by colour."""
from __future__ import annotations

import numpy as np
import pytest

from src.data.datasets.shapes import drawing
from src.data.datasets.shapes.datasets import ShapesClassification, ShapesSegmentation


def test_same_key_same_image() -> None:
    a, la = drawing.make_classification_image(3, "train", 17, 32, 8)
    b, lb = drawing.make_classification_image(3, "train", 17, 32, 8)
    assert a.dtype == np.uint8 and a.shape == (32, 32, 3)
    assert la == lb and np.array_equal(a, b)
    m1 = drawing.make_segmentation_image(3, "val", 5, 48, 4)
    m2 = drawing.make_segmentation_image(3, "val", 5, 48, 4)
    assert np.array_equal(m1[0], m2[0]) and np.array_equal(m1[1], m2[1])


@pytest.mark.parametrize("other", [(4, "train", 17), (3, "val", 17), (3, "train", 18)])
def test_seed_split_index_each_change_the_image(other: tuple[int, str, int]) -> None:
    base, _ = drawing.make_classification_image(3, "train", 17, 32, 8)
    img, _ = drawing.make_classification_image(*other, 32, 8)
    # Whole images differ, not a few pixels: mean absolute difference well above the noise level.
    assert np.abs(img.astype(int) - base.astype(int)).mean() > 10


def test_no_duplicate_images_in_a_split() -> None:
    ds = ShapesClassification(0, "train", 500, 32, 8, cache=False)
    digests = {ds.raw(i)[0].tobytes() for i in range(len(ds))}
    assert len(digests) == 500


def test_classes_balanced() -> None:
    ds = ShapesClassification(0, "val", 1003, 32, 8)
    counts = np.bincount(ds.targets, minlength=8)
    assert counts.max() - counts.min() <= 1
    assert [ds.raw(i)[1] for i in range(16)] == ds.targets[:16]


def test_mean_colour_does_not_reveal_the_class() -> None:
    """A nearest-centroid classifier on per-image mean RGB and brightness stays near chance (1/8)."""
    k, n = 8, 1600
    feats, labels = [], []
    for i in range(n):
        img, label = drawing.make_classification_image(0, "train", i, 32, k)
        f = img.reshape(-1, 3).astype(float)
        feats.append(np.concatenate([f.mean(0), f.std(0)]))
        labels.append(label)
    x, y = np.array(feats), np.array(labels)
    x = (x - x.mean(0)) / x.std(0)
    train, test = slice(0, 1200), slice(1200, n)
    centroids = np.stack([x[train][y[train] == c].mean(0) for c in range(k)])
    pred = np.argmin(((x[test][:, None] - centroids[None]) ** 2).sum(-1), axis=1)
    acc = (pred == y[test]).mean()
    # Chance is 12.5%; 400 test images give a std of ~1.7 points, so 25% is far beyond what chance reaches
    # while a colour- or brightness-coded class would give close to 100%.
    assert acc < 0.25, acc


def test_mask_consistent_with_image() -> None:
    """Mask pixels of a shape have its colour; labels stay within 0..K; some of every label appears."""
    k = 4
    seen = set()
    for i in range(40):
        img, mask = drawing.make_segmentation_image(1, "train", i, 64, k, noise_std=0.0)
        assert mask.shape == img.shape[:2] and mask.dtype == np.uint8
        assert mask.max() <= k
        seen.update(np.unique(mask).tolist())
        # Inside each labelled region (eroded by one pixel, away from antialiased edges) the colour is
        # nearly constant, since shapes are flat-coloured and noise is off here.
        for c in np.unique(mask):
            if c == 0:
                continue
            region = mask == c
            core = region.copy()
            core[1:] &= region[:-1]; core[:-1] &= region[1:]; core[:, 1:] &= region[:, :-1]; core[:, :-1] &= region[:, 1:]
            if core.sum() < 10:
                continue
            # Two shapes of the same kind may have different colours, so compare per connected blob via
            # the spread: a flat colour has at most a few levels of spread per channel per blob; allow
            # for two blobs by checking that the most common colour covers a large share of the core.
            colours, counts = np.unique(img[core].reshape(-1, 3), axis=0, return_counts=True)
            assert counts.max() >= 0.3 * core.sum(), (i, c)
    assert seen == set(range(k + 1))


def test_variable_val_sizes() -> None:
    ds = ShapesSegmentation(0, "val", 30, 64, 4, variable_size=True)
    sizes = {tuple(ds[i][0].shape[1:]) for i in range(30)}
    assert len(sizes) > 10
    assert all(48 <= h <= 80 and 48 <= w <= 80 for h, w in sizes)
    for i in range(5):
        image, mask = ds[i]
        assert tuple(mask.shape) == tuple(image.shape[1:])
    fixed = ShapesSegmentation(0, "train", 5, 64, 4)
    assert {tuple(fixed[i][0].shape) for i in range(5)} == {(3, 64, 64)}


def test_cache_generates_each_image_once() -> None:
    """Speed sanity by count: repeated access (every epoch) does not regenerate images."""

    class Counting(ShapesClassification):
        calls = 0

        def _generate(self, index: int):  # type: ignore[override]
            Counting.calls += 1
            return super()._generate(index)

    ds = Counting(0, "train", 50, 32, 8, cache=True)
    for _ in range(3):
        for i in range(50):
            ds[i]
    assert Counting.calls == 50
    uncached = Counting(0, "train", 50, 32, 8, cache=False)
    Counting.calls = 0
    for _ in range(2):
        for i in range(50):
            uncached[i]
    assert Counting.calls == 100


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="split"):
        drawing.make_classification_image(0, "training", 0, 32, 8)
    with pytest.raises(ValueError, match="2..8"):
        drawing.make_classification_image(0, "train", 0, 32, 9)
    with pytest.raises(IndexError):
        ShapesClassification(0, "train", 5, 32, 8)[5]
