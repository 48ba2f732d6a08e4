"""Decoding one found record with its layout's decoder (:func:`read_record`)."""

from __future__ import annotations

from ..errors import DataError, os_reason
from .records import CaseRecord, Decoded
from .registry import implementation, layout_spec


def read_record(layout: str, rec: CaseRecord) -> Decoded:
    """Decode and validate one record at its original resolution (PNG: at most
    :data:`~feddg.data.layouts.limits.MAX_IMAGE_SIDE`), with the decoder ``layout`` declares.

    Raises DataError naming the site, the file(s) and the problem for: an unknown layout, an unreadable or corrupt
    file (the OS's reason included), an image/mask shape mismatch, a NIfTI mask on another voxel grid than its image
    (spacing, direction, origin), a NIfTI file that is not a 3D volume or has NaN/Inf voxels, mask values outside the
    layout's encoding, a PNG mask with a non-constant alpha channel. Suspicious but usable input is in
    :attr:`Decoded.warnings`.
    """
    spec = layout_spec(layout)
    decode = implementation(spec.decoder)
    try:
        return decode(rec, spec)
    except OSError as e:  # the readers turn OS errors into DataErrors; this catches any they miss
        raise DataError(f"cannot read ({os_reason(e)})", site=rec.site, paths=[rec.image_path, rec.mask_path]) from e
