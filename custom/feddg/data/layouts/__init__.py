"""The on-disk layouts of the public FedDG data sets: finding a site's image/mask pairs and decoding them.

Each layout is declared once, in :data:`feddg.layouts.LAYOUTS` (name, task, files, mask encoding, and the dotted
paths of its scanner and decoder); this package holds the code those paths name (see ``/work/shared/data/README.md``
for the public sources). Resizing, normalisation and splitting are layout-independent and live in
:mod:`feddg.data.dataset`. One module per concern:

==================  ================================================================================================
``registry``        a layout's declaration by name (:func:`layout_spec`); the declared code, imported on first use
``scanning``        :func:`scan_site` / :func:`discover_site`, and the pairing rules the scanners share
``decoding``        :func:`read_record`: one record decoded by its layout's decoder
``saml_nifti``      the ``saml_nifti`` scanner and decoder (NIfTI volumes, mask beside the image)
``slice_png``       the ``slice_png`` scanner and decoder (grayscale PNG slices, inverted mask)
``dofe_png``        the ``dofe_png`` scanner and decoder (RGB fundus PNGs, cup / rim / background mask)
``files``           file-system guards: every failure to examine, list or read a path is a DataError naming it
``png``             reading 8-bit PNG images and masks (validated, reduced above :data:`MAX_IMAGE_SIDE`)
``nifti``           reading a NIfTI volume (:func:`read_nifti`), shared with ``feddg segment``
``geometry``        a mask must lie on its image's grid: shape; NIfTI voxel size, direction and origin
``limits``          plausibility limits and their warnings (:data:`MAX_FOREGROUND_SHARE`, :data:`MAX_IMAGE_SIDE`)
``records``         :class:`CaseRecord` (a found pair) and :class:`Decoded` (its arrays)
==================  ================================================================================================

Images and masks are paired by file name only: an image whose mask is missing is an error, never paired with a
neighbouring slice's mask. Nothing is skipped silently: a symbolic link that cannot be followed, a folder the OS
refuses to list and a file it refuses to read are problems naming the path, like a missing or corrupt file.
Suspicious but usable input (a mask covering most of the image, an image far larger than the task needs) gives a
:class:`~feddg.data.errors.DataWarning`.
"""

from .decoding import read_record
from .files import site_folders
from .limits import MAX_FOREGROUND_SHARE, MAX_IMAGE_SIDE, capped_size, foreground_warnings
from .nifti import NiftiVolume, read_nifti
from .records import CaseRecord, Decoded
from .registry import layout_spec
from .saml_nifti import saml_mask_case
from .scanning import discover_site, scan_site
from .slice_png import slice_png_name

__all__ = [
    "MAX_FOREGROUND_SHARE",
    "MAX_IMAGE_SIDE",
    "CaseRecord",
    "Decoded",
    "NiftiVolume",
    "capped_size",
    "discover_site",
    "foreground_warnings",
    "layout_spec",
    "read_nifti",
    "read_record",
    "saml_mask_case",
    "scan_site",
    "site_folders",
    "slice_png_name",
]
