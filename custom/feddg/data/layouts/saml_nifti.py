"""The ``saml_nifti`` layout's code (declared in :data:`feddg.layouts.LAYOUTS`): SAML multi-site prostate volumes.

``<root>/<SITE>/CaseNN.nii.gz`` (or ``.nii``) with its mask ``CaseNN_segmentation.nii.gz`` beside it; BMC spells it
``_Segmentation``, and both spellings are accepted for every site. No split folders. Label: any non-zero voxel is
prostate. A record is a whole volume, sliced axially.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from feddg.layouts import LAYOUTS, Layout

from ..errors import DataError
from .geometry import check_same_geometry
from .nifti import read_nifti
from .records import CaseRecord, Decoded
from .scanning import Found, entries, pair, strip_suffix, unusable

# The SAML release names masks CaseNN_segmentation; BMC uses CaseNN_Segmentation. Accept either for every site.
_MASK = re.compile(r"^(?P<case>.+)_[sS]egmentation$")


def saml_mask_case(file_name: str) -> str | None:
    """The case whose mask a file of the ``saml_nifti`` layout is (``Case00_segmentation.nii.gz`` -> ``Case00``),
    or None when the name is not a mask's (an image, or not a NIfTI file)."""
    stem = strip_suffix(file_name, LAYOUTS["saml_nifti"].suffixes)
    match = _MASK.match(stem) if stem is not None else None
    return match.group("case") if match else None


def scan(layout: Layout, site_dir: Path, site: str) -> Found:
    """The volumes directly in ``site_dir``, each paired with the mask named after it; a second file for one case
    (``Case00.nii`` beside ``Case00.nii.gz``) is a problem naming both."""
    found, problems = entries(site_dir, layout.suffixes, site)
    reported = unusable(problems)
    images: dict[str, Path] = {}
    masks: dict[str, Path] = {}
    for stem, p in found:
        m = _MASK.match(stem)
        key, target = (m.group("case"), masks) if m else (stem, images)
        if key in target:
            problems.append(DataError(f"two files for case {key!r}", site=site, paths=[target[key], p]))
            continue
        target[key] = p
    pairs, unpaired = pair(images, masks, site, reported)
    records = [CaseRecord(site, key, None, img, msk) for key, img, msk in pairs]
    return records, problems + unpaired


def _check_labels(mask: np.ndarray, spec: Layout, rec: CaseRecord) -> None:
    """A NIfTI mask must hold non-negative integer labels."""
    if np.issubdtype(mask.dtype, np.floating) and (mask != np.round(mask)).any():
        raise DataError("mask has non-integer values (expected integer labels)", site=rec.site, paths=[rec.mask_path])
    if mask.size and mask.min() < 0:
        raise DataError(
            f"mask has negative values (min {mask.min()}); expected {spec.encoding}",
            site=rec.site, paths=[rec.mask_path],
        )


def decode(rec: CaseRecord, spec: Layout) -> Decoded:
    """One volume and its mask: (Z, 1, X, Y) float32 intensities and prostate labels, voxel spacing in mm."""
    image = read_nifti(rec.image_path, what="image", site=rec.site)
    mask = read_nifti(rec.mask_path, what="mask", site=rec.site, as_float=False)
    check_same_geometry(image.stored, mask.stored, rec)
    _check_labels(mask.data, spec, rec)
    # Equal affines give equal reorientations. Slice axially: the third voxel axis of the canonical image; a slice is
    # (X, Y): rows along x, columns along y.
    n = image.data.shape[2]
    return Decoded(
        image=np.moveaxis(image.data, 2, 0)[:, None],
        labels=np.moveaxis(mask.data != 0, 2, 0)[:, None],
        slice_index=np.arange(n, dtype=np.int64),
        spacing=image.zooms,
        shape=tuple(image.data.shape),
    )
