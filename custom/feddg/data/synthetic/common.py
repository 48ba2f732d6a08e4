"""What the prostate and the fundus generators share: one random generator per case, smooth random textures, the
acquisition's loss of quality (blur, lower resolution, noise) and file writing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from scipy import ndimage

# Part of every case's seed, so that the two tasks draw unrelated cases for the same site index and case number.
TASK_CODES = {"prostate": 0, "fundus": 1}


def case_rng(seed: int, task: str, site_index: int, case: int) -> np.random.Generator:
    """The generator of one case, seeded by ``(seed, task, site, case)`` (``site_index``: the site's position in the
    task's site list): the files of a site do not depend on which other sites are generated."""
    return np.random.default_rng(np.random.SeedSequence([seed, TASK_CODES[task], site_index, case]))


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


def write_bytes(path: Path, payload: bytes) -> None:
    """Write ``payload`` to ``path``, creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(payload)
