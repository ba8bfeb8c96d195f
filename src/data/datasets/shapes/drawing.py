"""Procedural "shapes" images: deterministic from (seed, split, index), no files, no download.

One generator serves both tasks. Classification draws one dominant shape per image (label = its
kind); segmentation draws several shapes that may occlude each other and returns the per-pixel mask
(0 = background, k = shape kind k-1). Colours are drawn independently of the kind, so only the
geometry tells the classes apart; the textured background and pixel noise keep it from being trivial.

Masks have no ignore pixels: a pixel belongs to the top-most shape whose antialiased coverage is at
least one half, which is also where the image is closer to that shape's colour than to what lies
beneath. (255 appears only where augmentation pads a crop.)
"""
from __future__ import annotations

import functools
import math

import numpy as np

SPLITS = {"train": 0, "val": 1, "test": 2}

# Order matters: `num_classes = K` uses the first K kinds.
SHAPE_NAMES: tuple[str, ...] = (
    "circle", "square", "triangle", "star", "cross", "ring", "crescent", "diamond",
)
MAX_CLASSES = len(SHAPE_NAMES)
# Used when data.num_classes is null: calibrated so that the default job (CIFAR ResNet-20, a few epochs)
# clears 90% while the 8-kind variant (adds crescent vs circle, diamond vs square) stays harder.
DEFAULT_CLASSIFICATION_KINDS = 6
DEFAULT_SEGMENTATION_KINDS = 4


def _polygon(vertices: list[tuple[float, float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Precompute the radial function of a polygon that is star-shaped around the origin.

    Returns the sorted vertex angles and, per edge, its start point P0 and direction E = P1 - P0,
    so that the boundary distance along a ray of angle phi is (P0 x E) / (d x E).
    """
    pts = np.asarray(vertices, dtype=np.float64)
    ang = np.arctan2(pts[:, 1], pts[:, 0]) % (2 * math.pi)
    order = np.argsort(ang)
    pts, ang = pts[order], ang[order]
    p0 = pts
    e = np.roll(pts, -1, axis=0) - pts
    return ang, p0, e


def _regular(n: int, radii: list[float], phase: float = 0.0) -> list[tuple[float, float]]:
    step = 2 * math.pi / n
    return [(radii[i % len(radii)] * math.cos(phase + i * step), radii[i % len(radii)] * math.sin(phase + i * step))
            for i in range(n)]


_W = 0.34  # half-width of the cross's arms, in units of its radius
_POLYGONS = {
    # Radii are chosen so that the kinds cover similar areas (mean brightness must not tell them apart).
    "square": _polygon(_regular(4, [1.05], math.pi / 4)),
    "triangle": _polygon(_regular(3, [1.25], math.pi / 2)),
    "star": _polygon(_regular(10, [1.2, 0.5], math.pi / 2)),
    "cross": _polygon([(1, _W), (_W, _W), (_W, 1), (-_W, 1), (-_W, _W), (-1, _W), (-1, -_W), (-_W, -_W),
                       (-_W, -1), (_W, -1), (_W, -_W), (1, -_W)]),
    "diamond": _polygon([(1.2, 0.0), (0.0, 0.6), (-1.2, 0.0), (0.0, -0.6)]),
}


@functools.lru_cache(maxsize=64)
def _grid(h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Pixel-centre coordinates, cached per size because every image of a size shares them."""
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
    return ys, xs


def _coverage(kind: str, u: np.ndarray, v: np.ndarray, radius_px: float) -> np.ndarray:
    """Antialiased coverage in [0, 1] of shape `kind` at local coordinates (u, v) (unit = radius)."""
    rho = np.hypot(u, v)
    soft = radius_px  # converts a radial distance in units of the radius into pixels

    def inside(boundary: np.ndarray | float, r: np.ndarray = rho) -> np.ndarray:
        return np.clip((boundary - r) * soft + 0.5, 0.0, 1.0)

    if kind == "circle":
        return inside(0.95)
    if kind == "ring":
        return np.minimum(inside(1.05), 1.0 - inside(0.6))
    if kind == "crescent":
        bite = np.hypot(u - 0.55, v)
        return np.minimum(inside(1.05), 1.0 - inside(0.8, bite))
    ang, p0, e = _POLYGONS[kind]
    phi = np.arctan2(v, u) % (2 * math.pi)
    edge = (np.searchsorted(ang, phi, side="right") - 1) % len(ang)
    ex, ey = e[edge, 0], e[edge, 1]
    num = p0[edge, 0] * ey - p0[edge, 1] * ex
    den = np.cos(phi) * ey - np.sin(phi) * ex
    boundary = num / np.where(np.abs(den) < 1e-9, 1e-9, den)
    return inside(boundary)


def _luminance(c: np.ndarray) -> float:
    return float(0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2])


def _background(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A random colour, a linear gradient and a sinusoidal grating: texture the net must ignore."""
    ys, xs = _grid(h, w)
    p = rng.random(12)  # one draw for every scalar: per-call overhead dominates at 32x32
    base = 30 + 195 * p[0:3]
    gx, gy = (p[3:5] * 80 - 40) / max(h, w)
    freq = 0.15 + 0.75 * p[5]
    theta = math.pi * p[6]
    amp = 25 * p[7:10]
    phase = 2 * math.pi * p[10]
    wave = np.sin(xs * np.float32(freq * math.cos(theta)) + ys * np.float32(freq * math.sin(theta)) + np.float32(phase))
    ramp = xs * np.float32(gx) + ys * np.float32(gy)
    img = (ramp[..., None] + base.astype(np.float32)) + wave[..., None] * amp.astype(np.float32)
    return img


def _shape_colour(rng: np.random.Generator, bg_colour: np.ndarray, min_contrast: float = 55.0) -> np.ndarray:
    """A uniformly random colour, shifted in brightness just enough to stand out from the background."""
    colour = rng.uniform(0, 255, size=3)
    diff = _luminance(colour) - _luminance(bg_colour)
    if abs(diff) < min_contrast:
        sign = 1.0 if diff >= 0 else -1.0
        if _luminance(bg_colour) + sign * min_contrast > 250 or _luminance(bg_colour) + sign * min_contrast < 5:
            sign = -sign
        colour = colour + (_luminance(bg_colour) + sign * min_contrast - _luminance(colour))
    return np.clip(colour, 0, 255)


def _paint(img: np.ndarray, rng: np.random.Generator, kind: str, cy: float, cx: float, radius: float,
           colour: np.ndarray) -> tuple[np.ndarray, tuple[slice, slice]]:
    """Blend one shape into `img` (float HxWx3) in place; returns its coverage and where it lies.

    Only the shape's bounding box is computed (every kind fits in 1.3 radii), which is most of the speed.
    """
    h, w = img.shape[:2]
    reach = 1.3 * radius + 1
    y0, y1 = max(0, int(cy - reach)), min(h, int(cy + reach) + 2)
    x0, x1 = max(0, int(cx - reach)), min(w, int(cx + reach) + 2)
    box = (slice(y0, y1), slice(x0, x1))
    ys, xs = _grid(h, w)
    theta = 2 * math.pi * rng.random()
    c, s = math.cos(theta) / radius, math.sin(theta) / radius
    dx, dy = xs[box] - np.float32(cx), ys[box] - np.float32(cy)
    u, v = dx * np.float32(c) + dy * np.float32(s), dy * np.float32(c) - dx * np.float32(s)
    alpha = _coverage(kind, u, v, radius).astype(np.float32)
    region = img[box]
    region += alpha[..., None] * (colour.astype(np.float32) - region)
    return alpha, box


def _rng(seed: int, split: str, index: int, salt: int) -> np.random.Generator:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
    return np.random.default_rng([seed & 0xFFFFFFFF, SPLITS[split], index, salt])


def _photometric(img: np.ndarray, seed: int, split: str, index: int, spread: float) -> None:
    """Shift the image's statistics in place: a per-image contrast gain, brightness and colour offset.

    spread = 0 leaves the image untouched; 1 gives gains in [0.4, 2.5] and means moved by up to about
    +-110 of 255. The draws come from a generator of their own (salt 3), so switching this on changes no
    other draw: the shapes, their places and the labels stay those of spread = 0. This makes the
    statistics of a batch of two images far from those of the whole set, which is what per-process
    BatchNorm at small batches suffers from (scripts/syncbn_benefit.py).
    """
    if spread <= 0:
        return
    p = _rng(seed, split, index, 3).uniform(-1.0, 1.0, size=5)
    gain = math.exp(p[0] * spread * math.log(2.5))
    offset = p[1] * spread * 70 + p[2:5] * spread * 40  # brightness shared by channels, plus colour
    img -= np.float32(127.5)
    img *= np.float32(gain)
    img += (127.5 + offset).astype(np.float32)


def _finish(img: np.ndarray, rng: np.random.Generator, noise_std: float) -> np.ndarray:
    """Add pixel noise and quantise to uint8 HxWx3."""
    img += rng.standard_normal(size=img.shape, dtype=np.float32) * np.float32(noise_std) + np.float32(0.5)
    np.clip(img, 0, 255, out=img)
    return img.astype(np.uint8)


def classification_label(index: int, num_classes: int) -> int:
    """The label of image `index`: classes cycle, so every split is balanced to within one image."""
    return index % num_classes


def make_classification_image(seed: int, split: str, index: int, size: int, num_classes: int,
                              noise_std: float = 10.0, photometric_spread: float = 0.0) -> tuple[np.ndarray, int]:
    """One image (uint8 HxWx3) with one dominant shape, and its label."""
    check_num_classes(num_classes)
    label = classification_label(index, num_classes)
    rng = _rng(seed, split, index, 0)
    img = _background(rng, size, size)
    radius = rng.uniform(0.2, 0.36) * size
    margin = radius * 0.8
    cy, cx = rng.uniform(margin, size - 1 - margin, size=2)
    colour = _shape_colour(rng, img[size // 2, size // 2])
    _paint(img, rng, SHAPE_NAMES[label], cy, cx, radius, colour)
    _photometric(img, seed, split, index, photometric_spread)
    return _finish(img, rng, noise_std), label


def segmentation_image_size(seed: int, split: str, index: int, size: int, variable: bool) -> tuple[int, int]:
    """(H, W) of segmentation image `index`: `size` squared, or drawn in [0.75, 1.25] x size when variable."""
    if not variable:
        return size, size
    rng = _rng(seed, split, index, 1)
    lo, hi = max(8, int(round(0.75 * size))), int(round(1.25 * size))
    h, w = rng.integers(lo, hi + 1, size=2)
    return int(h), int(w)


def make_segmentation_image(seed: int, split: str, index: int, size: int, num_classes: int,
                            min_shapes: int = 2, max_shapes: int = 4, variable_size: bool = False,
                            noise_std: float = 10.0, radius_range: tuple[float, float] = (0.2, 0.34),
                            photometric_spread: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """One image (uint8 HxWx3) with several shapes, and its mask (uint8 HxW; 0 = background).

    Shape radii are drawn in radius_range x the shorter side.
    """
    img, owner, kinds = make_instance_image(seed, split, index, size, num_classes, min_shapes, max_shapes,
                                            variable_size, noise_std, radius_range, photometric_spread)
    lut = np.zeros(len(kinds) + 1, dtype=np.uint8)
    lut[1:] = np.asarray(kinds, dtype=np.int64) + 1
    return img, lut[owner]


def make_instance_image(seed: int, split: str, index: int, size: int, num_classes: int,
                        min_shapes: int = 2, max_shapes: int = 4, variable_size: bool = False,
                        noise_std: float = 10.0, radius_range: tuple[float, float] = (0.2, 0.34),
                        photometric_spread: float = 0.0) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """The scene of make_segmentation_image (the same image for the same arguments), by instance.

    Returns the image (uint8 HxWx3), the owner map (HxW; 0 = background, j = the j-th shape drawn, so
    later shapes lie on top) and the kind of each shape (kinds[j - 1] is shape j's index in SHAPE_NAMES).
    A shape may be hidden completely by later ones, or lie partly outside the image: owner == j holds
    only its visible pixels (the same rule as the mask: top-most coverage >= one half).
    """
    check_num_classes(num_classes)
    h, w = segmentation_image_size(seed, split, index, size, variable_size)
    rng = _rng(seed, split, index, 2)
    img = _background(rng, h, w)
    bg_colour = img[h // 2, w // 2].copy()
    n = int(rng.integers(min_shapes, max_shapes + 1))
    owner = np.zeros((h, w), dtype=np.min_scalar_type(n))
    kinds: list[int] = []
    side = min(h, w)
    for j in range(1, n + 1):
        kind = int(rng.integers(0, num_classes))
        radius = rng.uniform(*radius_range) * side
        cy = rng.uniform(0, h - 1)
        cx = rng.uniform(0, w - 1)
        colour = _shape_colour(rng, bg_colour)
        alpha, box = _paint(img, rng, SHAPE_NAMES[kind], cy, cx, radius, colour)
        owner[box][alpha >= 0.5] = j
        kinds.append(kind)
    _photometric(img, seed, split, index, photometric_spread)
    return _finish(img, rng, noise_std), owner, kinds


def check_num_classes(num_classes: int) -> None:
    """Raise ValueError unless 2 <= num_classes <= MAX_CLASSES."""
    if not 2 <= num_classes <= MAX_CLASSES:
        raise ValueError(f"shapes supports 2..{MAX_CLASSES} classes ({', '.join(SHAPE_NAMES)}), got {num_classes}")
