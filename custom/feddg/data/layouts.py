"""On-disk layouts of the public FedDG data sets: finding a site's image/mask pairs and decoding them.

Three layouts are supported (see ``/work/shared/data/README.md`` for the public sources):

``saml_nifti``  SAML multi-site prostate volumes: ``<root>/<SITE>/CaseNN.nii.gz`` with ``CaseNN_segmentation.nii.gz``
                (BMC spells it ``_Segmentation``; both spellings are accepted for every site). No split folders.
                Label: any non-zero voxel is prostate.
``slice_png``   Prostate slices: ``<root>/<SITE>/{train,test}/{image,mask}/<case>_<slice>.png``, 8-bit grayscale;
                the mask is *inverted*: prostate = 0, background = 255.
``dofe_png``    DoFE fundus ROIs: ``<root>/<SITE>/{train,test}/ROIs/{image,mask}/<name>.png``, RGB images; masks are
                3-channel PNGs with cup = 0, rim = 128, background = 255; disc = rim ∪ cup.

This module holds everything that is layout-specific: discovery (:func:`scan_site`, :func:`discover_site`) and
decoding one record into raw arrays plus binary labels (:func:`read_record`). Resizing, normalisation and splitting
are layout-independent and live in :mod:`feddg.data.dataset`.

Images and masks are paired by file name only: an image whose mask is missing is an error, never paired with a
neighbouring slice's mask.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import DataError

SPLIT_FOLDERS = ("train", "test")


@dataclass(frozen=True)
class CaseRecord:
    """One image/mask pair on disk: a whole volume (``saml_nifti``) or one 2D image (PNG layouts)."""

    site: str
    case_id: str  # patient / image id; all slices of one patient share it (slice_png: the ``<case>`` name part)
    split: str | None  # 'train' / 'test' from the folder; None when the layout has no split folders
    image_path: Path
    mask_path: Path


@dataclass(frozen=True)
class LayoutSpec:
    """What the layout-independent loader needs to know about a layout."""

    name: str
    task: str  # the task whose labels the masks encode (keys of feddg.config.TASKS)
    channels: int  # image channels after decoding
    split_folders: bool  # True: <SITE>/{train,test}/...; False: all files directly in <SITE>/
    volumes: bool  # True: one record is a 3D volume with a known voxel spacing
    intensity: str  # "zscore" (MRI, arbitrary units) or "unit_range" (8-bit colour photographs -> [-1, 1])
    square_crop: bool  # centre-crop to a square before resizing (fundus: the papers crop the disc region)
    mask_values: frozenset[int] | None  # allowed mask values; None: any non-negative integer
    encoding: str  # the mask encoding in words, for error messages


LAYOUT_SPECS: dict[str, LayoutSpec] = {
    "saml_nifti": LayoutSpec(
        "saml_nifti", "prostate", 1, False, True, "zscore", False, None,
        "non-negative integer labels, any non-zero label = prostate",
    ),
    "slice_png": LayoutSpec(
        "slice_png", "prostate", 1, True, False, "zscore", False, frozenset({0, 255}),
        "0 = prostate, 255 = background",
    ),
    "dofe_png": LayoutSpec(
        "dofe_png", "fundus", 3, True, False, "unit_range", True, frozenset({0, 128, 255}),
        "0 = cup, 128 = rim, 255 = background",
    ),
}


def layout_spec(layout: str) -> LayoutSpec:
    """The :class:`LayoutSpec` of ``layout``; DataError naming the known layouts when it is unknown."""
    try:
        return LAYOUT_SPECS[layout]
    except KeyError:
        raise DataError(f"unknown data layout {layout!r}; known layouts are {sorted(LAYOUT_SPECS)}") from None


# --------------------------------------------------------------------------------------------------- discovery

_NIFTI_SUFFIXES = (".nii.gz", ".nii")
# The SAML release names masks CaseNN_segmentation; BMC uses CaseNN_Segmentation. Accept either for every site.
_SAML_MASK = re.compile(r"^(?P<case>.+)_[sS]egmentation$")


def _strip_suffix(name: str, suffixes: tuple[str, ...]) -> str | None:
    low = name.lower()
    for suffix in suffixes:
        if low.endswith(suffix):
            return name[: -len(suffix)]
    return None


def _files(folder: Path, suffixes: tuple[str, ...]) -> dict[str, Path]:
    """Visible regular files in ``folder`` ending in one of ``suffixes``, keyed by name without the suffix."""
    out: dict[str, Path] = {}
    for p in sorted(folder.iterdir()):
        if p.name.startswith(".") or not p.is_file():
            continue
        stem = _strip_suffix(p.name, suffixes)
        if stem is not None:
            out.setdefault(stem, p)
    return out


def _name_list(paths: list[Path], limit: int = 10) -> str:
    names = [p.name for p in paths[:limit]]
    more = f" and {len(paths) - limit} more" if len(paths) > limit else ""
    return ", ".join(names) + more


def _pair(
    images: dict[str, Path], masks: dict[str, Path], site: str
) -> tuple[list[tuple[str, Path, Path]], list[DataError]]:
    """Pair images and masks by key; one DataError naming every unpaired file when some are left over."""
    pairs = [(k, images[k], masks[k]) for k in sorted(images) if k in masks]
    lone_images = [images[k] for k in sorted(images) if k not in masks]
    lone_masks = [masks[k] for k in sorted(masks) if k not in images]
    if not (lone_images or lone_masks):
        return pairs, []
    what = []
    if lone_images:
        what.append(f"image has no mask ({_name_list(lone_images)})")
    if lone_masks:
        what.append(f"mask has no image ({_name_list(lone_masks)})")
    reason = "unpaired files: " + "; ".join(what) + " (images and masks are paired by file name only)"
    return pairs, [DataError(reason, site=site, paths=lone_images + lone_masks)]


def _scan_saml(site_dir: Path, site: str) -> tuple[list[CaseRecord], list[DataError]]:
    images: dict[str, Path] = {}
    masks: dict[str, Path] = {}
    problems: list[DataError] = []
    for p in sorted(site_dir.iterdir()):
        stem = _strip_suffix(p.name, _NIFTI_SUFFIXES)
        if stem is None or p.name.startswith(".") or not p.is_file():
            continue  # readme files and the like
        m = _SAML_MASK.match(stem)
        key, target = (m.group("case"), masks) if m else (stem, images)
        if key in target:
            problems.append(DataError(f"two files for case {key!r}", site=site, paths=[target[key], p]))
            continue
        target[key] = p
    pairs, unpaired = _pair(images, masks, site)
    records = [CaseRecord(site, key, None, img, msk) for key, img, msk in pairs]
    return records, problems + unpaired


def _scan_split_folders(
    site_dir: Path, site: str, image_sub: tuple[str, ...], mask_sub: tuple[str, ...], case_of: Callable[[str], str]
) -> tuple[list[CaseRecord], list[DataError]]:
    """Shared by the PNG layouts: ``<site_dir>/<split>/<image_sub>/*.png`` paired with ``<mask_sub>/*.png``."""
    records: list[CaseRecord] = []
    problems: list[DataError] = []
    splits = [s for s in SPLIT_FOLDERS if (site_dir / s).is_dir()]
    if not splits:
        expected = "/".join(("{train,test}",) + image_sub)
        reason = f"no train/ or test/ folder (expected <site>/{expected}/*.png)"
        problems.append(DataError(reason, site=site, paths=[site_dir]))
    for split in splits:
        image_dir = site_dir.joinpath(split, *image_sub)
        mask_dir = site_dir.joinpath(split, *mask_sub)
        missing = [d for d in (image_dir, mask_dir) if not d.is_dir()]
        if missing:
            problems.append(DataError("folder is missing", site=site, paths=missing))
            continue
        pairs, unpaired = _pair(_files(image_dir, (".png",)), _files(mask_dir, (".png",)), site)
        problems += unpaired
        records += [CaseRecord(site, case_of(key), split, img, msk) for key, img, msk in pairs]
    return records, problems


def slice_png_name(stem: str) -> tuple[str, int]:
    """``"<case>_<slice>"`` -> (case, slice); a stem without a numeric ``_<slice>`` part is its own case, slice 0."""
    case, sep, idx = stem.rpartition("_")
    if sep and case and idx.isdigit():
        return case, int(idx)
    return stem, 0


def scan_site(layout: str, root: Path, site: str) -> tuple[list[CaseRecord], list[DataError]]:
    """Find a site's image/mask pairs without raising for data problems.

    Returns the paired records (sorted by split, case, file name) and every problem found: missing or empty site
    folder, missing image/mask folders, unpaired files, duplicate cases. Raises DataError only for an unknown layout.
    """
    layout_spec(layout)
    site_dir = Path(root) / site
    if not site_dir.is_dir():
        known = sorted(p.name for p in Path(root).iterdir() if p.is_dir()) if Path(root).is_dir() else []
        where = f"folders under the root: {known}" if Path(root).is_dir() else "the data root does not exist"
        return [], [DataError(f"site folder is missing ({where})", site=site, paths=[site_dir])]
    if layout == "saml_nifti":
        records, problems = _scan_saml(site_dir, site)
    elif layout == "slice_png":
        records, problems = _scan_split_folders(
            site_dir, site, ("image",), ("mask",), lambda key: slice_png_name(key)[0]
        )
    else:  # dofe_png: one image per eye, the file stem is the case id
        records, problems = _scan_split_folders(site_dir, site, ("ROIs", "image"), ("ROIs", "mask"), lambda key: key)
    if not records and not problems:
        problems.append(DataError(f"site folder has no images for layout {layout}", site=site, paths=[site_dir]))
    order = {None: 0, "train": 0, "test": 1}
    records.sort(key=lambda r: (order[r.split], r.case_id, r.image_path.name))
    return records, problems


def discover_site(layout: str, root: Path, site: str) -> list[CaseRecord]:
    """A site's image/mask pairs, one :class:`CaseRecord` per volume (NIfTI) or per 2D image (PNG layouts).

    Raises DataError (naming the site, the files and the problem) for an unknown layout, a missing or empty site
    folder, or any image without its mask / mask without its image. Reads no pixel data.
    """
    records, problems = scan_site(layout, root, site)
    if problems:
        first = problems[0]
        if len(problems) > 1:
            more = f" (and {len(problems) - 1} more problem(s) in this site; the data check lists them all)"
            raise DataError(first.reason + more, site=first.site, paths=first.paths)
        raise first
    return records


# ---------------------------------------------------------------------------------------------------- decoding


@dataclass
class Decoded:
    """One record decoded at its original resolution.

    Attributes:
        image: (n, C, H, W) float32 raw intensities (n = slices of a volume, 1 for a PNG).
        labels: (n, L, H, W) bool, one channel per structure of the layout's task.
        slice_index: (n,) int64 axial index of each slice inside its volume (PNG: the ``<slice>`` name part or 0).
        spacing: (row, col, slice) mm per pixel, or None when the layout does not know it.
        shape: the stored data shape (NIfTI: after reorientation to the closest canonical orientation).
    """

    image: np.ndarray
    labels: np.ndarray
    slice_index: np.ndarray
    spacing: tuple[float, float, float] | None
    shape: tuple[int, ...]


def _read_png(path: Path, site: str, what: str) -> np.ndarray:
    """8-bit PNG pixels as uint8, (H, W) or (H, W, 3); alpha dropped, palette images expanded to RGB."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            im.load()
            mode = im.mode
            if mode == "P":
                im = im.convert("RGB")
            elif mode == "1":
                im = im.convert("L")
            elif mode in ("RGBA", "LA"):
                im = im.convert(mode[:-1])
            if im.mode not in ("L", "RGB"):
                raise DataError(f"{what} is not an 8-bit PNG (PIL mode {mode!r})", site=site, paths=[path])
            return np.asarray(im, dtype=np.uint8)
    except DataError:
        raise
    except Exception as e:  # PIL raises OSError, SyntaxError, ValueError... for broken files
        raise DataError(f"cannot read {what} file ({type(e).__name__}: {e})", site=site, paths=[path]) from e


def _single_channel(a: np.ndarray, path: Path, site: str, what: str) -> np.ndarray:
    """(H, W) from a grayscale PNG or a 3-channel one whose channels are identical."""
    if a.ndim == 2:
        return a
    if np.array_equal(a[..., 0], a[..., 1]) and np.array_equal(a[..., 0], a[..., 2]):
        return a[..., 0]
    raise DataError(f"{what} should be grayscale but its colour channels differ", site=site, paths=[path])


def _check_mask_values(mask: np.ndarray, spec: LayoutSpec, path: Path, site: str) -> None:
    """Mask values must belong to the layout's encoding; uint8 PNG masks are checked with a histogram (fast)."""
    present = np.flatnonzero(np.bincount(mask.ravel(), minlength=256))
    bad = sorted(set(present.tolist()) - set(spec.mask_values))
    if bad:
        shown = ", ".join(map(str, bad[:10])) + (" ..." if len(bad) > 10 else "")
        raise DataError(
            f"mask contains values {{{shown}}} outside the {spec.name} encoding ({spec.encoding})",
            site=site, paths=[path],
        )


def _check_finite(image: np.ndarray, path: Path, site: str) -> None:
    if not np.isfinite(image).all():
        n = int((~np.isfinite(image)).sum())
        raise DataError(f"image has {n} NaN/Inf pixel(s)", site=site, paths=[path])


def _check_same_shape(a: tuple[int, ...], b: tuple[int, ...], rec: CaseRecord) -> None:
    if a != b:
        raise DataError(
            f"image/mask shape mismatch: image {a}, mask {b}", site=rec.site, paths=[rec.image_path, rec.mask_path]
        )


def _read_nifti(path: Path, site: str, what: str, as_float: bool) -> tuple[np.ndarray, tuple[float, float, float]]:
    """A 3D NIfTI volume reoriented to the closest canonical (RAS+) orientation, and its voxel size in mm."""
    import nibabel as nib

    try:
        img = nib.as_closest_canonical(nib.load(str(path)))
        data = img.get_fdata(dtype=np.float32) if as_float else np.asanyarray(img.dataobj)
        zooms = tuple(float(z) for z in img.header.get_zooms()[:3])
    except Exception as e:  # nibabel / gzip / zlib errors for truncated or garbage files
        raise DataError(f"cannot read {what} file ({type(e).__name__}: {e})", site=site, paths=[path]) from e
    while data.ndim > 3 and data.shape[-1] == 1:
        data = data[..., 0]
    if data.ndim != 3:
        raise DataError(f"{what} is not a 3D volume (shape {data.shape})", site=site, paths=[path])
    return data, zooms  # type: ignore[return-value]


def _decode_saml(rec: CaseRecord, spec: LayoutSpec) -> Decoded:
    image, zooms = _read_nifti(rec.image_path, rec.site, "image", as_float=True)
    mask, _ = _read_nifti(rec.mask_path, rec.site, "mask", as_float=False)
    _check_same_shape(image.shape, mask.shape, rec)
    _check_finite(image, rec.image_path, rec.site)
    if np.issubdtype(mask.dtype, np.floating):
        if not np.isfinite(mask).all() or (mask != np.round(mask)).any():
            reason = "mask has non-integer values (expected integer labels)"
            raise DataError(reason, site=rec.site, paths=[rec.mask_path])
    if mask.size and mask.min() < 0:
        raise DataError(
            f"mask has negative values (min {mask.min()}); expected {spec.encoding}",
            site=rec.site, paths=[rec.mask_path],
        )
    # Slice axially: the third voxel axis of the canonical image. A slice is (X, Y): rows along x, columns along y.
    n = image.shape[2]
    return Decoded(
        image=np.moveaxis(image, 2, 0)[:, None],
        labels=np.moveaxis(mask != 0, 2, 0)[:, None],
        slice_index=np.arange(n, dtype=np.int64),
        spacing=zooms,
        shape=tuple(image.shape),
    )


def _decode_slice_png(rec: CaseRecord, spec: LayoutSpec) -> Decoded:
    image = _single_channel(_read_png(rec.image_path, rec.site, "image"), rec.image_path, rec.site, "image")
    mask = _single_channel(_read_png(rec.mask_path, rec.site, "mask"), rec.mask_path, rec.site, "mask")
    _check_same_shape(image.shape, mask.shape, rec)
    _check_mask_values(mask, spec, rec.mask_path, rec.site)
    return Decoded(
        image=image.astype(np.float32)[None, None],
        labels=(mask == 0)[None, None],  # inverted encoding: prostate is black
        slice_index=np.array([slice_png_name(rec.image_path.name[:-4])[1]], dtype=np.int64),
        spacing=None,
        shape=tuple(image.shape),
    )


def _decode_dofe_png(rec: CaseRecord, spec: LayoutSpec) -> Decoded:
    image = _read_png(rec.image_path, rec.site, "image")
    if image.ndim != 3:
        raise DataError("fundus image is grayscale; expected an RGB image", site=rec.site, paths=[rec.image_path])
    mask = _single_channel(_read_png(rec.mask_path, rec.site, "mask"), rec.mask_path, rec.site, "mask")
    _check_same_shape(image.shape[:2], mask.shape, rec)
    # The real DoFE sample masks hold exactly {0, 128, 255} (checked on all 8 of them), so no tolerance is applied:
    # any other value means the mask was resampled or lossy-compressed, and guessing its class would be silent harm.
    _check_mask_values(mask, spec, rec.mask_path, rec.site)
    disc = mask <= 128  # rim (128) or cup (0): the disc is the union
    cup = mask == 0
    return Decoded(
        image=np.moveaxis(image, 2, 0).astype(np.float32)[None],
        labels=np.stack([disc, cup])[None],
        slice_index=np.zeros(1, dtype=np.int64),
        spacing=None,
        shape=tuple(image.shape),
    )


_DECODERS = {"saml_nifti": _decode_saml, "slice_png": _decode_slice_png, "dofe_png": _decode_dofe_png}


def read_record(layout: str, rec: CaseRecord) -> Decoded:
    """Decode and validate one record at its original resolution.

    Raises DataError naming the site, the file(s) and the problem for: an unreadable or corrupt file, an image/mask
    shape mismatch, mask values outside the layout's encoding, NaN/Inf image pixels.
    """
    spec = layout_spec(layout)
    return _DECODERS[layout](rec, spec)
