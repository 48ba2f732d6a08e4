"""What the prostate and the fundus generators share: one random generator per case (and one for its annotator),
smooth random textures, the acquisition's loss of quality (blur, lower resolution, noise), the annotator's mask of
an imaged outline (margin, smoothing, jitter) and file writing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np
from scipy import ndimage

T = TypeVar("T")

# Part of every case's seed, so that the two tasks draw unrelated cases for the same site index and case number.
TASK_CODES = {"prostate": 0, "fundus": 1}


def case_rng(seed: int, task: str, site_index: int, case: int) -> np.random.Generator:
    """The generator of one case, seeded by ``(seed, task, site, case)`` (``site_index``: the site's position in the
    task's site list): the files of a site do not depend on which other sites are generated."""
    return np.random.default_rng(np.random.SeedSequence([seed, TASK_CODES[task], site_index, case]))


def label_rng(seed: int, task: str, site_index: int, case: int) -> np.random.Generator:
    """A second generator of the same case, for the annotator's randomness only (e.g. a jagged outline).

    Kept apart from :func:`case_rng` so that a case's image does not depend on how its site labels it: the same
    anatomy drawn under another labelling convention gives the same image bytes."""
    return np.random.default_rng(np.random.SeedSequence([seed, TASK_CODES[task], site_index, case, 1]))


def sigmoid(x: np.ndarray) -> np.ndarray:
    """The logistic function, elementwise (through tanh: no overflow for large ``|x|``)."""
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def smooth_noise(rng: np.random.Generator, shape: tuple[int, ...], sigma: Sequence[float]) -> np.ndarray:
    """Gaussian-filtered white noise rescaled to unit standard deviation (a random texture)."""
    field = ndimage.gaussian_filter(rng.standard_normal(shape).astype(np.float32), sigma, mode="reflect")
    return field / (field.std() + 1e-8)


def _resample_inplane(vol: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Linear resampling of the first two axes of ``vol`` to ``shape`` (pixel-area aligned grid)."""
    factors = [shape[0] / vol.shape[0], shape[1] / vol.shape[1]] + [1.0] * (vol.ndim - 2)
    return ndimage.zoom(vol, factors, order=1, mode="nearest", grid_mode=True)


def degrade(
    img: np.ndarray,
    blur: float,
    downsample: float,
    noise_fn: Callable[[np.ndarray], np.ndarray],
    px_scale: float,
) -> np.ndarray:
    """Blur, lose resolution, add noise at the acquisition resolution, then return to the stored size.

    ``img`` is ``(H, W, ...)``; blur and resampling act on the first two axes only. Noise is added on
    the low-resolution grid so that a low-resolution site also has coarser (correlated) noise.
    """
    size = img.shape[:2]
    if blur > 0:
        img = ndimage.gaussian_filter(img, [blur * px_scale] * 2 + [0] * (img.ndim - 2), mode="nearest")
    if downsample > 1.0:
        low = (max(4, round(size[0] / downsample)), max(4, round(size[1] / downsample)))
        img = noise_fn(_resample_inplane(img, low))
        return _resample_inplane(img, size)
    return noise_fn(img)


def signed_distance_px(q: np.ndarray) -> np.ndarray:
    """First-order signed distance (px, positive inside) to the level set ``q == 1`` of a smooth field ``q`` that is
    < 1 inside a shape, e.g. a normalised radius; ``q`` is ``(H, W, ...)`` and the distance is in-plane (axes 0, 1).

    ``(1 - q) / |grad q|`` is zero on the outline and close to the true distance within a few pixels of it, which is
    where label margins, smoothing and jitter act (a plain ``(1 - q) * radius`` would stretch a margin along an
    ellipse's long axis by the axis ratio); its sign is always that of ``1 - q``, so thresholding it at 0 gives back
    ``q <= 1`` exactly."""
    gy, gx = np.gradient(q, axis=(0, 1))
    return (1.0 - q) / np.maximum(np.hypot(gx, gy), 1e-6)


def annotate(
    distance: np.ndarray,
    margin: float,
    smoothing: float,
    px_scale: float,
    jitter: np.ndarray | None = None,
) -> np.ndarray:
    """An annotator's binary mask from a shape's signed distance ``(H, W)`` or ``(H, W, S)`` (px, positive inside).

    ``margin`` (px at size 96, scaled by ``px_scale``) moves the outline outwards (> 0, a dilated mask) or inwards
    (< 0, an eroded one); ``jitter`` (px, same shape) is added to the distance as well; ``smoothing`` (px at
    size 96) is the sigma of an in-plane Gaussian applied to the mask, which rounds corners and irons out lobes and
    notches narrower than about the sigma, as a spline contour does. Smoothing keeps each slice's area: margin
    alone sets the size, so the two conventions stay separate (a plain threshold of the blurred mask at one half
    would also shrink small convex shapes, a small cup by up to a third at sigma 2 px). Returns a bool array of ``distance``'s
    shape.
    """
    d = distance + margin * px_scale
    if jitter is not None:
        d = d + jitter
    # A pixel straddling the outline counts by the share of it inside (a linear ramp one pixel wide): thresholding
    # this at 0.5 is thresholding d at 0, and smoothing it does not see the pixel grid's staircase.
    soft = np.clip(0.5 + d, 0.0, 1.0).astype(np.float32)
    mask = soft >= 0.5
    if smoothing <= 0:
        return mask
    sigma = [smoothing * px_scale] * 2 + [0.0] * (soft.ndim - 2)
    blurred = ndimage.gaussian_filter(soft, sigma, mode="constant")
    # Per slice, keep the `area` most strongly blurred-in pixels: a threshold of the blurred mask that keeps its area.
    flat = blurred.reshape(soft.shape[0] * soft.shape[1], -1)  # (H*W, S)
    area = mask.reshape(flat.shape).sum(0)  # (S,)
    ranked = -np.sort(-flat, axis=0)  # each column descending
    level = ranked[np.maximum(area - 1, 0), np.arange(flat.shape[1])]  # (S,) the area-th largest value
    out = (flat >= level[None, :]) & (area > 0)[None, :]
    return out.reshape(soft.shape)


def write_bytes(path: Path, payload: bytes) -> None:
    """Write ``payload`` to ``path``, creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(payload)


def site_content(table: Mapping[str, T], neutral: T, site: str, shift: str) -> T:
    """What a site images and how it labels it: its entry of ``table`` under ``style_and_content``, ``neutral``
    (the same for every site) under ``style_only``."""
    if shift == "style_only":
        return neutral
    if shift == "style_and_content":
        return table[site]
    raise ValueError(f"synthetic.shift: expected 'style_and_content' or 'style_only', got {shift!r}")
