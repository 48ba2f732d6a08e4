"""Reading 8-bit PNG images and masks, the shared part of the PNG layouts' decoders.

An image is read as 8-bit grayscale or RGB (palette expanded, 1-bit widened, alpha dropped); a mask must hold one
channel (grayscale, or RGB with identical channels) whose values all belong to the layout's encoding, checked at the
stored size before any resampling. Images whose longest side exceeds
:data:`~feddg.data.layouts.limits.MAX_IMAGE_SIDE` are reduced to it in 8 bits (box filter; masks by nearest
neighbour on the same grid), with a warning, before numpy sees a pixel. PIL is imported on first use.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from feddg.layouts import Layout

from ..errors import DataError, DataWarning
from .files import reading
from .geometry import check_same_shape
from .limits import MAX_IMAGE_SIDE
from .records import CaseRecord


def _png_size(path: Path, site: str, what: str) -> tuple[int, int]:
    """(H, W) from the PNG header; no pixel is decoded (PIL opens lazily)."""
    from PIL import Image

    with reading(path, site, what), Image.open(path) as im:
        return im.height, im.width


def _require_constant_alpha(im, path: Path, site: str) -> None:
    lo, hi = im.getchannel("A").getextrema()
    if lo != hi:
        raise DataError(
            f"mask has a non-constant alpha channel (values {lo}..{hi}): labels must be stored in the gray or colour "
            "channels, the alpha channel is not read", site=site, paths=[path],
        )


def _as_l_or_rgb(im, path: Path, site: str, what: str, mask: bool):
    """``im`` as an 8-bit grayscale ("L") or RGB PIL image: palette expanded, 1-bit widened, alpha removed.

    An image's alpha is dropped; a mask's must be constant, or a label held only in alpha would be silently lost.
    """
    mode = im.mode
    if mode in ("P", "PA"):
        im = im.convert("RGBA" if mode == "PA" or "transparency" in im.info else "RGB")
    elif mode == "1":
        im = im.convert("L")
    if im.mode in ("RGBA", "LA"):
        if mask:
            _require_constant_alpha(im, path, site)
        im = im.convert(im.mode[:-1])
    if im.mode not in ("L", "RGB"):
        raise DataError(f"{what} is not an 8-bit PNG (PIL mode {mode!r})", site=site, paths=[path])
    return im


def read_image(path: Path, site: str, size: tuple[int, int]) -> np.ndarray:
    """An image's 8-bit pixels as uint8, (H, W) or (H, W, 3) (see :func:`_as_l_or_rgb`), at ``size`` (H, W):
    a larger stored image is reduced with a box filter (area average) in 8 bits, before numpy sees a pixel."""
    from PIL import Image

    with reading(path, site, "image"), Image.open(path) as im:
        im = _as_l_or_rgb(im, path, site, "image", mask=False)
        if size != (im.height, im.width):
            im = im.resize((size[1], size[0]), Image.Resampling.BOX)
        return np.asarray(im, dtype=np.uint8)


def single_channel(a: np.ndarray, path: Path, site: str, what: str) -> np.ndarray:
    """(H, W) from a grayscale PNG or a 3-channel one whose channels are identical."""
    if a.ndim == 2:
        return a
    if np.array_equal(a[..., 0], a[..., 1]) and np.array_equal(a[..., 0], a[..., 2]):
        return a[..., 0]
    raise DataError(f"{what} should be grayscale but its colour channels differ", site=site, paths=[path])


# Masks are validated at full size a block of rows (about 4 Mpx) at a time: converting a whole PIL image to numpy
# makes two full-size copies, and np.bincount an int64 one, which for an 8000 px RGB mask is over a gigabyte.
_BLOCK_PIXELS = 1 << 22


def _row_blocks(height: int, width: int) -> range:
    return range(0, height, max(1, _BLOCK_PIXELS // max(1, width)))


def _values_present(a: np.ndarray) -> list[int]:
    """The distinct values of a 2D uint8 array."""
    seen = np.zeros(256, bool)
    step = _row_blocks(*a.shape).step
    for top in _row_blocks(*a.shape):
        seen |= np.bincount(a[top : top + step].ravel(), minlength=256) > 0
    return np.flatnonzero(seen).tolist()


def _check_mask_values(mask: np.ndarray, spec: Layout, path: Path, site: str) -> None:
    """Mask values must belong to the layout's encoding."""
    bad = sorted(set(_values_present(mask)) - set(spec.mask_values))
    if bad:
        shown = ", ".join(map(str, bad[:10])) + (" ..." if len(bad) > 10 else "")
        raise DataError(
            f"mask contains values {{{shown}}} outside the {spec.name} encoding ({spec.encoding})",
            site=site, paths=[path],
        )


def _nearest(a: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """``a`` (H, W) sampled at ``size`` (H', W') by nearest neighbour on the pixel centres of the box filter's grid, so
    that a reduced mask keeps only values of its encoding and stays aligned with its reduced image."""
    if a.shape[:2] == size:
        return a
    rows = ((np.arange(size[0]) + 0.5) * (a.shape[0] / size[0])).astype(np.intp)
    cols = ((np.arange(size[1]) + 0.5) * (a.shape[1] / size[1])).astype(np.intp)
    return a[np.ix_(rows, cols)]


def pair_size(rec: CaseRecord) -> tuple[int, int]:
    """The stored (H, W) of a record's image and mask, from their headers; DataError when they differ."""
    image = _png_size(rec.image_path, rec.site, "image")
    mask = _png_size(rec.mask_path, rec.site, "mask")
    check_same_shape(image, mask, rec)
    return image


def _mask_channel(im, path: Path, site: str) -> np.ndarray:
    """(H, W) uint8 of a grayscale or RGB PIL mask whose channels are identical, converted a block of rows at a time."""
    out = np.empty((im.height, im.width), np.uint8)
    blocks = _row_blocks(im.height, im.width)
    for top in blocks:
        box = (0, top, im.width, min(top + blocks.step, im.height))
        out[top : box[3]] = single_channel(np.asarray(im.crop(box), dtype=np.uint8), path, site, "mask")
    return out


def read_mask(rec: CaseRecord, spec: Layout, size: tuple[int, int]) -> np.ndarray:
    """The record's mask, (H, W) uint8 at ``size``: validated at its stored size (one channel, values in the
    encoding), then sampled by nearest neighbour, so nothing outside the encoding can appear or hide."""
    from PIL import Image

    path = rec.mask_path
    with reading(path, rec.site, "mask"), Image.open(path) as im:
        mask = _mask_channel(_as_l_or_rgb(im, path, rec.site, "mask", mask=True), path, rec.site)
    _check_mask_values(mask, spec, path, rec.site)
    return _nearest(mask, size)


def size_warnings(rec: CaseRecord, stored: tuple[int, int], size: tuple[int, int]) -> list[DataWarning]:
    if stored == size:
        return []
    reason = (
        f"image and mask are {stored[0]}x{stored[1]} px, larger than the {MAX_IMAGE_SIDE} px (longest side) this task "
        f"ever needs; both are reduced to {size[0]}x{size[1]} px in 8 bits before use"
    )
    return [DataWarning(reason, site=rec.site, paths=(rec.image_path, rec.mask_path))]

