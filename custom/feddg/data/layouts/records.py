"""What the layouts hand to the loader: a found image/mask pair (:class:`CaseRecord`) and its decoded arrays
(:class:`Decoded`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import DataWarning


@dataclass(frozen=True)
class CaseRecord:
    """One image/mask pair on disk: a whole volume (``saml_nifti``) or one 2D image (PNG layouts)."""

    site: str
    case_id: str  # patient / image id; all slices of one patient share it (slice_png: the ``<case>`` name part)
    split: str | None  # 'train' / 'test' from the folder; None when the layout has no split folders
    image_path: Path
    mask_path: Path


@dataclass
class Decoded:
    """One record decoded at its original resolution (PNG images above
    :data:`~feddg.data.layouts.limits.MAX_IMAGE_SIDE`: reduced to it).

    Attributes:
        image: (n, C, H, W) float32 raw intensities (n = slices of a volume, 1 for a PNG).
        labels: (n, L, H, W) bool, one channel per structure of the layout's task.
        slice_index: (n,) int64 axial index of each slice inside its volume (PNG: the ``<slice>`` name part or 0).
        spacing: (row, col, slice) mm per pixel, or None when the layout does not know it.
        shape: the stored data shape (NIfTI: after reorientation to the closest canonical orientation).
        warnings: suspicious but usable input found while decoding (an oversized image).
    """

    image: np.ndarray
    labels: np.ndarray
    slice_index: np.ndarray
    spacing: tuple[float, float, float] | None
    shape: tuple[int, ...]
    warnings: list[DataWarning] = field(default_factory=list)
