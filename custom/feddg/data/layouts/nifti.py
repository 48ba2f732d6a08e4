"""Reading a NIfTI volume by the one rule the loader and ``feddg segment`` share (:func:`read_nifti`).

nibabel is imported on first use.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import DataError
from .files import reading

if TYPE_CHECKING:
    import nibabel as nib


@dataclass(frozen=True)
class NiftiVolume:
    """A 3D NIfTI volume read by :func:`read_nifti`.

    Attributes:
        data: (X, Y, Z) voxels in the closest canonical (RAS+) orientation; float32, or as stored for label maps.
        zooms: voxel size in mm along X, Y, Z.
        stored: the file's image as stored (trailing axes of length 1 removed): its affine and header, for comparing
            an image with its mask and for writing results back in the file's own geometry.
    """

    data: np.ndarray
    zooms: tuple[float, float, float]
    stored: nib.Nifti1Image

    def to_stored(self, canonical: np.ndarray) -> np.ndarray:
        """An (X, Y, Z) array in :attr:`data`'s voxel order, put back in the file's own voxel order."""
        from nibabel import orientations as o

        back = o.ornt_transform(o.axcodes2ornt("RAS"), o.io_orientation(self.stored.affine))
        return o.apply_orientation(canonical, back)


def _as_3d(img: nib.Nifti1Image, path: Path, site: str | None, what: str) -> nib.Nifti1Image:
    """``img`` without its trailing axes of length 1 ((X, Y, Z, 1) is a 3D volume); DataError when not 3D then."""
    ndim = img.ndim
    while ndim > 3 and img.shape[ndim - 1] == 1:
        ndim -= 1
    if ndim != 3:
        raise DataError(f"{what} is not a 3D volume (shape {img.shape})", site=site, paths=[path])
    return img if img.ndim == 3 else img.slicer[(slice(None),) * 3 + (0,) * (img.ndim - 3)]


def _require_finite(data: np.ndarray, path: Path, site: str | None, what: str) -> None:
    if np.issubdtype(data.dtype, np.floating):  # integer voxels are always finite
        bad = int(np.count_nonzero(~np.isfinite(data)))
        if bad:
            raise DataError(f"{what} has {bad} NaN/Inf voxel(s)", site=site, paths=[path])


def read_nifti(path: Path, *, what: str = "image", site: str | None = None, as_float: bool = True) -> NiftiVolume:
    """Read a NIfTI volume by the one rule the loader and ``feddg segment`` share.

    Trailing axes of length 1 are dropped; what remains must be 3D and every voxel finite. The voxels are reoriented
    to the closest canonical (RAS+) orientation. ``as_float``: float32 intensities; False: the stored values (labels).

    Raises:
        DataError naming ``site`` (when given), the file and the problem: "cannot read <what> file (...)",
        "<what> is not a 3D volume (shape ...)", "<what> has N NaN/Inf voxel(s)".
    """
    import nibabel as nib

    with reading(path, site, what):
        stored = _as_3d(nib.load(str(path)), path, site, what)
        canonical = nib.as_closest_canonical(stored)
        data = canonical.get_fdata(dtype=np.float32) if as_float else np.asanyarray(canonical.dataobj)
        zooms = tuple(float(z) for z in canonical.header.get_zooms()[:3])
    _require_finite(data, path, site, what)
    return NiftiVolume(data, zooms, stored)  # type: ignore[arg-type]
