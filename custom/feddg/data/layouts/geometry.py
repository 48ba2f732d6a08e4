"""Image/mask geometry: a mask must lie on its image's pixel or voxel grid.

PNG pairs are compared by shape; NIfTI pairs by shape, voxel size, direction cosines and origin, from the stored
affines, within the tolerances below. nibabel is imported on first use (for the axis codes of a message).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..errors import DataError
from .records import CaseRecord

if TYPE_CHECKING:
    import nibabel as nib


def check_same_shape(a: tuple[int, ...], b: tuple[int, ...], rec: CaseRecord) -> None:
    """The image's stored shape ``a`` must equal the mask's ``b``; DataError naming both files otherwise."""
    if a != b:
        raise DataError(
            f"image/mask shape mismatch: image {a}, mask {b}", site=rec.site, paths=[rec.image_path, rec.mask_path]
        )


# Image/mask geometry tolerances. A mask written from its image differs from it only by float rounding: NIfTI keeps
# the affine as float32 (srow_*, ~1e-7 relative) and as a float32 quaternion (qform) that tools re-orthonormalise
# (~1e-6..1e-4 in the direction cosines when image and mask were written by different tools). A mask on another grid
# differs by a flip (a cosine changes by 2), another slice thickness (percents) or a shift by a voxel or more. These
# limits sit 10-1000x above the rounding and far below any misplacement that would move a label (MONAI compares
# affines to 1e-3). The project's sample data hold no NIfTI volume (only PNG slices), so these limits come from the
# format, not from measured files.
_SPACING_RTOL = 1e-3  # voxel size, relative (0.1%)
_DIRECTION_ATOL = 1e-3  # each direction cosine (about 0.06 degrees)
_ORIGIN_ATOL_VOXELS = 1e-2  # origin, in units of the image's smallest voxel size (3-6 um for prostate MRI)


def _geometry(affine: np.ndarray) -> dict[str, np.ndarray]:
    """Voxel size (mm), direction cosines (one column per voxel axis) and origin (mm) of a voxel-to-world affine."""
    m = np.asarray(affine, dtype=np.float64)[:3, :3]
    spacing = np.linalg.norm(m, axis=0)
    return {"spacing": spacing, "direction": m / np.where(spacing > 0, spacing, 1.0), "origin": affine[:3, 3]}


def _shown(name: str, affine: np.ndarray, value: np.ndarray) -> str:
    """A geometry property for a message: rounded numbers, in mm or (direction) led by the axis codes."""
    import nibabel as nib

    numbers = str((np.round(np.asarray(value, dtype=np.float64), 5) + 0.0).tolist())
    if name == "direction":
        return f"{''.join(nib.aff2axcodes(affine))} {numbers}"
    return f"{numbers} mm"


def check_same_geometry(image: nib.Nifti1Image, mask: nib.Nifti1Image, rec: CaseRecord) -> None:
    """The mask must lie on the image's voxel grid: shape, spacing, direction and origin, compared from the stored
    affines (before reorientation, which would hide a mask stored flipped) within the tolerances above."""
    check_same_shape(tuple(image.shape), tuple(mask.shape), rec)
    a, b = _geometry(image.affine), _geometry(mask.affine)
    tolerance = {
        "spacing": _SPACING_RTOL * a["spacing"],
        "direction": _DIRECTION_ATOL,
        "origin": _ORIGIN_ATOL_VOXELS * a["spacing"].min(),
    }
    for name in ("spacing", "direction", "origin"):
        if np.any(np.abs(a[name] - b[name]) > tolerance[name]):
            raise DataError(
                f"image/mask geometry mismatch: {name} differs (image {_shown(name, image.affine, a[name])}, mask "
                f"{_shown(name, mask.affine, b[name])}); the mask must lie on the image's voxel grid",
                site=rec.site, paths=[rec.image_path, rec.mask_path],
            )

