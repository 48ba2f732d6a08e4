"""The ``slice_png`` layout's code (declared in :data:`feddg.layouts.LAYOUTS`): prostate MRI slices as PNGs.

``<root>/<SITE>/{train,test}/{image,mask}/<case>_<slice>.png``, 8-bit grayscale (an RGB file whose channels are
identical is accepted); the mask is *inverted*: prostate = 0, background = 255. A record is one slice; the slices
of one patient share the ``<case>`` part of their name.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from feddg.layouts import Layout

from .limits import capped_size
from .png import pair_size, read_image, read_mask, single_channel, size_warnings
from .records import CaseRecord, Decoded
from .scanning import Found, scan_split_folders, strip_suffix


def slice_png_name(stem: str) -> tuple[str, int]:
    """``"<case>_<slice>"`` -> (case, slice); a stem without a numeric ``_<slice>`` part is its own case, slice 0."""
    case, sep, idx = stem.rpartition("_")
    if sep and case and idx.isdigit():
        return case, int(idx)
    return stem, 0


def scan(layout: Layout, site_dir: Path, site: str) -> Found:
    """The slices of each split folder, paired by file name; the case is the name's ``<case>`` part."""
    return scan_split_folders(layout, site_dir, site, lambda key: slice_png_name(key)[0])


def decode(rec: CaseRecord, spec: Layout) -> Decoded:
    """One slice: (1, 1, H, W) float32 intensities 0..255 and the prostate label, at most
    :data:`~feddg.data.layouts.limits.MAX_IMAGE_SIDE` px (a larger pair is reduced, with a warning)."""
    stored = pair_size(rec)
    size = capped_size(stored)
    image = read_image(rec.image_path, rec.site, size)
    image = single_channel(image, rec.image_path, rec.site, "image")
    mask = read_mask(rec, spec, size)
    stem = strip_suffix(rec.image_path.name, spec.suffixes) or rec.image_path.stem
    return Decoded(
        image=image.astype(np.float32)[None, None],
        labels=(mask == 0)[None, None],  # inverted encoding: prostate is black
        slice_index=np.array([slice_png_name(stem)[1]], dtype=np.int64),
        spacing=None,
        shape=stored,
        warnings=size_warnings(rec, stored, size),
    )
