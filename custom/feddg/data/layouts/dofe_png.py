"""The ``dofe_png`` layout's code (declared in :data:`feddg.layouts.LAYOUTS`): DoFE fundus regions of interest.

``<root>/<SITE>/{train,test}/ROIs/{image,mask}/<name>.png``: RGB images; masks are 3-channel PNGs (identical
channels) with cup = 0, rim = 128, background = 255; disc = rim ∪ cup. A record is one eye; its file stem is the
case id. Any other file (the data set's file lists) is ignored.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from feddg.layouts import Layout

from ..errors import DataError
from .limits import capped_size
from .png import pair_size, read_image, read_mask, size_warnings
from .records import CaseRecord, Decoded
from .scanning import Found, scan_split_folders


def scan(layout: Layout, site_dir: Path, site: str) -> Found:
    """The images of each split folder, paired by file name; one image per eye, the file stem is the case id."""
    return scan_split_folders(layout, site_dir, site, lambda key: key)


def decode(rec: CaseRecord, spec: Layout) -> Decoded:
    """One image: (1, 3, H, W) float32 intensities 0..255 and the (disc, cup) labels, at most
    :data:`~feddg.data.layouts.limits.MAX_IMAGE_SIDE` px (a larger pair is reduced, with a warning)."""
    stored = pair_size(rec)
    size = capped_size(stored)
    image = read_image(rec.image_path, rec.site, size)
    if image.ndim != 3:
        raise DataError("fundus image is grayscale; expected an RGB image", site=rec.site, paths=[rec.image_path])
    # The real DoFE sample masks hold exactly {0, 128, 255} (checked on all 8 of them), so no tolerance is applied:
    # any other value means the mask was resampled or lossy-compressed, and guessing its class would be silent harm.
    mask = read_mask(rec, spec, size)
    disc = mask <= 128  # rim (128) or cup (0): the disc is the union
    cup = mask == 0
    return Decoded(
        image=np.moveaxis(image, 2, 0).astype(np.float32)[None],
        labels=np.stack([disc, cup])[None],
        slice_index=np.zeros(1, dtype=np.int64),
        spacing=None,
        shape=stored + (3,),
        warnings=size_warnings(rec, stored, size),
    )
