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
neighbouring slice's mask. Nothing is skipped silently: a symbolic link that cannot be followed, a folder the OS
refuses to list and a file it refuses to read are problems naming the path, like a missing or corrupt file.

Suspicious but usable input (a mask covering most of the image, an image far larger than the task needs) gives a
:class:`~feddg.data.errors.DataWarning`; the limits are :data:`MAX_FOREGROUND_SHARE` and :data:`MAX_IMAGE_SIDE`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .errors import DataError, DataWarning, os_reason

if TYPE_CHECKING:
    import nibabel as nib

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


# ------------------------------------------------------------------------------------------------ plausibility

# The largest share of all pixels of one split that a structure can plausibly cover. Real masks stay far below it:
# the prostate covers 0.7-1.2% of the MiDSS slices (all six sites' samples), the optic disc 7.6-18.5% of the 800 px
# DoFE ROIs (all four domains). More than half of all pixels means an inverted encoding (slice_png's prostate is 0, not
# 255) or a label the reader does not see; it is a warning, not an error, because a tightly cropped data set may
# legitimately come closer than the public ones. The cup lies inside the disc, so the disc's limit covers it.
MAX_FOREGROUND_SHARE: dict[str, float] = {"prostate": 0.5, "disc": 0.5}

# The longest image side the task ever needs. The networks see 384 px; the public fundus ROIs are 800 px, the whole
# fundus photographs they are cut from about 1400-2900 px (REFUGE, RIM-ONE, Drishti-GS), MRI slices 256-512 px.
# 4096 px leaves room for any camera in use, and bounds one decoded image as float32 at 4096 x 4096 x 3 x 4 B = 192 MiB,
# where an 8000 px photograph costs 730 MiB per copy. Larger images are reduced to it in 8 bits, with a warning.
MAX_IMAGE_SIDE = 4096


def foreground_warnings(layout: str, site: str, split: str, share: Mapping[str, float]) -> list[DataWarning]:
    """A warning for each structure covering more of ``split``'s pixels than :data:`MAX_FOREGROUND_SHARE` allows.

    ``share``: structure -> its share of all pixels of the split. The data check and the loader both call this, so
    they warn alike.
    """
    spec = layout_spec(layout)
    warnings = []
    for name, value in share.items():
        limit = MAX_FOREGROUND_SHARE.get(name)
        if limit is not None and value > limit:
            reason = (
                f"split {split}: {name} covers {value:.1%} of all pixels, implausible for {spec.task} data (more than "
                f"{limit:.0%}); is the mask encoding inverted? {spec.name} masks must be {spec.encoding}"
            )
            warnings.append(DataWarning(reason, site=site))
    return warnings


def capped_size(size: tuple[int, int]) -> tuple[int, int]:
    """(H, W) scaled down, aspect ratio kept, so that the longest side is at most :data:`MAX_IMAGE_SIDE`."""
    longest = max(size)
    if longest <= MAX_IMAGE_SIDE:
        return size
    scale = MAX_IMAGE_SIDE / longest
    return max(1, round(size[0] * scale)), max(1, round(size[1] * scale))


# --------------------------------------------------------------------------------------------------- file system


def _link_target(path: Path) -> str | None:
    """Where the symbolic link ``path`` points; None when it is no link (or cannot be examined)."""
    try:
        return os.readlink(path)
    except OSError:
        return None


def _exists(path: Path, site: str | None) -> bool:
    """Whether ``path`` can be used; False when nothing is there.

    Raises DataError naming the path for a symbolic link that cannot be followed (dangling or looping: skipping it
    would silently drop data) and for a path the OS refuses to examine (permissions).
    """
    try:
        path.stat()
    except OSError as e:
        target = _link_target(path)
        if isinstance(e, FileNotFoundError) and target is None:
            return False
        reason = f"cannot access ({os_reason(e)})"
        if target is not None:
            reason = f"broken symbolic link (points to {target!r}: {os_reason(e)})"
        raise DataError(reason, site=site, paths=[path]) from e
    return True


def _is_dir(path: Path, site: str | None) -> bool:
    """Whether ``path`` is a usable folder; DataError as :func:`_exists`."""
    return _exists(path, site) and path.is_dir()


def _list_dir(folder: Path, site: str | None) -> list[Path]:
    """The entries of ``folder`` in name order; DataError naming it and the OS's reason when it cannot be listed."""
    try:
        return sorted(folder.iterdir())
    except OSError as e:
        raise DataError(f"cannot list folder ({os_reason(e)})", site=site, paths=[folder]) from e


def site_folders(root: Path) -> list[str]:
    """The sites of a data folder: the names of ``root``'s visible sub-folders, in name order.

    An entry that cannot be examined (a dangling or looping symbolic link, no permission) is listed too, so that
    scanning that site reports why. Raises DataError when ``root`` is missing, not a folder or cannot be listed.
    """
    root = Path(root)
    if not _is_dir(root, None):
        raise DataError("data root folder does not exist" if not root.exists() else "data root is not a folder",
                        paths=[root])
    names = []
    for p in _list_dir(root, None):
        if p.name.startswith("."):
            continue
        try:
            usable = _is_dir(p, p.name)
        except DataError:
            usable = True  # scan_site reports it, under the site's name
        if usable:
            names.append(p.name)
    return names


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


def saml_mask_case(file_name: str) -> str | None:
    """The case whose mask a file of the ``saml_nifti`` layout is (``Case00_segmentation.nii.gz`` -> ``Case00``),
    or None when the name is not a mask's (an image, or not a NIfTI file)."""
    stem = _strip_suffix(file_name, _NIFTI_SUFFIXES)
    match = _SAML_MASK.match(stem) if stem is not None else None
    return match.group("case") if match else None


def _entries(folder: Path, suffixes: tuple[str, ...], site: str) -> tuple[list[tuple[str, Path]], list[DataError]]:
    """The visible files in ``folder`` ending in one of ``suffixes``: (name without the suffix, path), in name order.

    Entries that cannot be read as files (a dangling or looping symbolic link, one the OS refuses to examine, a
    device or pipe) are listed too, so that their partner is not called unpaired, and each gets a DataError.
    Folders are left out. Raises DataError when ``folder`` cannot be listed.
    """
    entries: list[tuple[str, Path]] = []
    problems: list[DataError] = []
    for p in _list_dir(folder, site):
        stem = _strip_suffix(p.name, suffixes)
        if stem is None or p.name.startswith("."):
            continue  # readme files and the like
        try:
            if not _exists(p, site) or p.is_dir():
                continue  # removed meanwhile, or a folder
            if not p.is_file():
                problems.append(DataError("not a regular file", site=site, paths=[p]))
        except DataError as e:
            problems.append(e)
        entries.append((stem, p))
    return entries, problems


def _unusable(problems: list[DataError]) -> set[Path]:
    return {Path(p) for e in problems for p in e.paths}


def _name_list(paths: list[Path], limit: int = 10) -> str:
    names = [p.name for p in paths[:limit]]
    more = f" and {len(paths) - limit} more" if len(paths) > limit else ""
    return ", ".join(names) + more


def _pair(
    images: dict[str, Path], masks: dict[str, Path], site: str, unusable: set[Path]
) -> tuple[list[tuple[str, Path, Path]], list[DataError]]:
    """Pair images and masks by key; one DataError naming every unpaired file when some are left over.

    Pairs with a file in ``unusable`` (already reported) are left out of the result.
    """
    pairs = [(k, images[k], masks[k]) for k in sorted(images) if k in masks]
    pairs = [(k, img, msk) for k, img, msk in pairs if img not in unusable and msk not in unusable]
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
    entries, problems = _entries(site_dir, _NIFTI_SUFFIXES, site)
    unusable = _unusable(problems)
    images: dict[str, Path] = {}
    masks: dict[str, Path] = {}
    for stem, p in entries:
        m = _SAML_MASK.match(stem)
        key, target = (m.group("case"), masks) if m else (stem, images)
        if key in target:
            problems.append(DataError(f"two files for case {key!r}", site=site, paths=[target[key], p]))
            continue
        target[key] = p
    pairs, unpaired = _pair(images, masks, site, unusable)
    records = [CaseRecord(site, key, None, img, msk) for key, img, msk in pairs]
    return records, problems + unpaired


def _first_by_key(entries: list[tuple[str, Path]]) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for key, p in entries:
        out.setdefault(key, p)
    return out


def _scan_split(
    site_dir: Path, site: str, split: str, image_sub: tuple[str, ...], mask_sub: tuple[str, ...],
    case_of: Callable[[str], str],
) -> tuple[list[CaseRecord], list[DataError]]:
    """One split folder of a PNG layout; DataError when one of its folders cannot be examined or listed."""
    _list_dir(site_dir / split, site)  # an unreadable split folder is named as such, not by a file below it
    image_dir = site_dir.joinpath(split, *image_sub)
    mask_dir = site_dir.joinpath(split, *mask_sub)
    missing = [d for d in (image_dir, mask_dir) if not _is_dir(d, site)]
    if missing:
        return [], [DataError("folder is missing", site=site, paths=missing)]
    images, image_problems = _entries(image_dir, (".png",), site)
    masks, mask_problems = _entries(mask_dir, (".png",), site)
    problems = image_problems + mask_problems
    pairs, unpaired = _pair(_first_by_key(images), _first_by_key(masks), site, _unusable(problems))
    return [CaseRecord(site, case_of(key), split, img, msk) for key, img, msk in pairs], problems + unpaired


def _scan_split_folders(
    site_dir: Path, site: str, image_sub: tuple[str, ...], mask_sub: tuple[str, ...], case_of: Callable[[str], str]
) -> tuple[list[CaseRecord], list[DataError]]:
    """Shared by the PNG layouts: ``<site_dir>/<split>/<image_sub>/*.png`` paired with ``<mask_sub>/*.png``."""
    records: list[CaseRecord] = []
    problems: list[DataError] = []
    splits = []
    for split in SPLIT_FOLDERS:
        try:
            if _is_dir(site_dir / split, site):
                splits.append(split)
        except DataError as e:
            problems.append(e)
    if not splits and not problems:
        expected = "/".join(("{train,test}",) + image_sub)
        reason = f"no train/ or test/ folder (expected <site>/{expected}/*.png)"
        problems.append(DataError(reason, site=site, paths=[site_dir]))
    for split in splits:
        try:
            found, split_problems = _scan_split(site_dir, site, split, image_sub, mask_sub, case_of)
        except DataError as e:
            found, split_problems = [], [e]
        records += found
        problems += split_problems
    return records, problems


def slice_png_name(stem: str) -> tuple[str, int]:
    """``"<case>_<slice>"`` -> (case, slice); a stem without a numeric ``_<slice>`` part is its own case, slice 0."""
    case, sep, idx = stem.rpartition("_")
    if sep and case and idx.isdigit():
        return case, int(idx)
    return stem, 0


def _scan_layout(layout: str, site_dir: Path, site: str) -> tuple[list[CaseRecord], list[DataError]]:
    if layout == "saml_nifti":
        return _scan_saml(site_dir, site)
    if layout == "slice_png":
        return _scan_split_folders(site_dir, site, ("image",), ("mask",), lambda key: slice_png_name(key)[0])
    # dofe_png: one image per eye, the file stem is the case id
    return _scan_split_folders(site_dir, site, ("ROIs", "image"), ("ROIs", "mask"), lambda key: key)


def _missing_site(root: Path, site: str, site_dir: Path) -> DataError:
    try:
        where = f"folders under the root: {site_folders(root)}"
    except DataError as e:
        where = e.reason
    return DataError(f"site folder is missing ({where})", site=site, paths=[site_dir])


def scan_site(layout: str, root: Path, site: str) -> tuple[list[CaseRecord], list[DataError]]:
    """Find a site's image/mask pairs without raising for data problems.

    Returns the paired records (sorted by split, case, file name) and every problem found: missing or empty site
    folder, missing image/mask folders, unpaired files, duplicate cases, symbolic links that cannot be followed, and
    folders or files the OS refuses to list or examine. Raises DataError only for an unknown layout.
    """
    layout_spec(layout)
    site_dir = Path(root) / site
    try:
        if not _is_dir(site_dir, site):
            return [], [_missing_site(Path(root), site, site_dir)]
        _list_dir(site_dir, site)  # an unreadable site folder is named as such, not by a folder below it
        records, problems = _scan_layout(layout, site_dir, site)
    except DataError as e:
        return [], [e]
    except OSError as e:  # the helpers above turn the OS's refusals into DataErrors; this catches any they miss
        where = e.filename if e.filename else site_dir
        return [], [DataError(f"cannot read the site folder ({os_reason(e)})", site=site, paths=[where])]
    if not records and not problems:
        problems.append(DataError(f"site folder has no images for layout {layout}", site=site, paths=[site_dir]))
    order = {None: 0, "train": 0, "test": 1}
    records.sort(key=lambda r: (order[r.split], r.case_id, r.image_path.name))
    return records, problems


def discover_site(layout: str, root: Path, site: str) -> list[CaseRecord]:
    """A site's image/mask pairs, one :class:`CaseRecord` per volume (NIfTI) or per 2D image (PNG layouts).

    Raises DataError (naming the site, the files and the problem) for any problem :func:`scan_site` finds: an unknown
    layout, a missing or empty site folder, an image without its mask or a mask without its image, a symbolic link
    that cannot be followed, a folder or file the OS refuses to list or examine. Reads no pixel data.
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
    """One record decoded at its original resolution (PNG images above :data:`MAX_IMAGE_SIDE`: reduced to it).

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


@contextmanager
def _reading(path: Path, site: str | None, what: str) -> Iterator[None]:
    """Turn any failure to read ``path`` into a DataError naming it (PIL, nibabel, gzip and the OS raise many types)."""
    try:
        yield
    except DataError:
        raise
    except Exception as e:
        raise DataError(f"cannot read {what} file ({os_reason(e)})", site=site, paths=[path]) from e


def _check_same_shape(a: tuple[int, ...], b: tuple[int, ...], rec: CaseRecord) -> None:
    if a != b:
        raise DataError(
            f"image/mask shape mismatch: image {a}, mask {b}", site=rec.site, paths=[rec.image_path, rec.mask_path]
        )


# ------------------------------------------------------------------------------------------------ PNG


def _png_size(path: Path, site: str, what: str) -> tuple[int, int]:
    """(H, W) from the PNG header; no pixel is decoded (PIL opens lazily)."""
    from PIL import Image

    with _reading(path, site, what), Image.open(path) as im:
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


def _read_image_png(path: Path, site: str, size: tuple[int, int]) -> np.ndarray:
    """An image's 8-bit pixels as uint8, (H, W) or (H, W, 3) (see :func:`_as_l_or_rgb`), at ``size`` (H, W):
    a larger stored image is reduced with a box filter (area average) in 8 bits, before numpy sees a pixel."""
    from PIL import Image

    with _reading(path, site, "image"), Image.open(path) as im:
        im = _as_l_or_rgb(im, path, site, "image", mask=False)
        if size != (im.height, im.width):
            im = im.resize((size[1], size[0]), Image.Resampling.BOX)
        return np.asarray(im, dtype=np.uint8)


def _single_channel(a: np.ndarray, path: Path, site: str, what: str) -> np.ndarray:
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


def _check_mask_values(mask: np.ndarray, spec: LayoutSpec, path: Path, site: str) -> None:
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


def _png_pair_size(rec: CaseRecord) -> tuple[int, int]:
    """The stored (H, W) of a record's image and mask, from their headers; DataError when they differ."""
    image = _png_size(rec.image_path, rec.site, "image")
    mask = _png_size(rec.mask_path, rec.site, "mask")
    _check_same_shape(image, mask, rec)
    return image


def _mask_channel(im, path: Path, site: str) -> np.ndarray:
    """(H, W) uint8 of a grayscale or RGB PIL mask whose channels are identical, converted a block of rows at a time."""
    out = np.empty((im.height, im.width), np.uint8)
    blocks = _row_blocks(im.height, im.width)
    for top in blocks:
        box = (0, top, im.width, min(top + blocks.step, im.height))
        out[top : box[3]] = _single_channel(np.asarray(im.crop(box), dtype=np.uint8), path, site, "mask")
    return out


def _read_mask_png(rec: CaseRecord, spec: LayoutSpec, size: tuple[int, int]) -> np.ndarray:
    """The record's mask, (H, W) uint8 at ``size``: validated at its stored size (one channel, values in the
    encoding), then sampled by nearest neighbour, so nothing outside the encoding can appear or hide."""
    from PIL import Image

    path = rec.mask_path
    with _reading(path, rec.site, "mask"), Image.open(path) as im:
        mask = _mask_channel(_as_l_or_rgb(im, path, rec.site, "mask", mask=True), path, rec.site)
    _check_mask_values(mask, spec, path, rec.site)
    return _nearest(mask, size)


def _size_warnings(rec: CaseRecord, stored: tuple[int, int], size: tuple[int, int]) -> list[DataWarning]:
    if stored == size:
        return []
    reason = (
        f"image and mask are {stored[0]}x{stored[1]} px, larger than the {MAX_IMAGE_SIDE} px (longest side) this task "
        f"ever needs; both are reduced to {size[0]}x{size[1]} px in 8 bits before use"
    )
    return [DataWarning(reason, site=rec.site, paths=(rec.image_path, rec.mask_path))]


def _decode_slice_png(rec: CaseRecord, spec: LayoutSpec) -> Decoded:
    stored = _png_pair_size(rec)
    size = capped_size(stored)
    image = _read_image_png(rec.image_path, rec.site, size)
    image = _single_channel(image, rec.image_path, rec.site, "image")
    mask = _read_mask_png(rec, spec, size)
    return Decoded(
        image=image.astype(np.float32)[None, None],
        labels=(mask == 0)[None, None],  # inverted encoding: prostate is black
        slice_index=np.array([slice_png_name(rec.image_path.name[:-4])[1]], dtype=np.int64),
        spacing=None,
        shape=stored,
        warnings=_size_warnings(rec, stored, size),
    )


def _decode_dofe_png(rec: CaseRecord, spec: LayoutSpec) -> Decoded:
    stored = _png_pair_size(rec)
    size = capped_size(stored)
    image = _read_image_png(rec.image_path, rec.site, size)
    if image.ndim != 3:
        raise DataError("fundus image is grayscale; expected an RGB image", site=rec.site, paths=[rec.image_path])
    # The real DoFE sample masks hold exactly {0, 128, 255} (checked on all 8 of them), so no tolerance is applied:
    # any other value means the mask was resampled or lossy-compressed, and guessing its class would be silent harm.
    mask = _read_mask_png(rec, spec, size)
    disc = mask <= 128  # rim (128) or cup (0): the disc is the union
    cup = mask == 0
    return Decoded(
        image=np.moveaxis(image, 2, 0).astype(np.float32)[None],
        labels=np.stack([disc, cup])[None],
        slice_index=np.zeros(1, dtype=np.int64),
        spacing=None,
        shape=stored + (3,),
        warnings=_size_warnings(rec, stored, size),
    )


# ------------------------------------------------------------------------------------------------ NIfTI


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

    with _reading(path, site, what):
        stored = _as_3d(nib.load(str(path)), path, site, what)
        canonical = nib.as_closest_canonical(stored)
        data = canonical.get_fdata(dtype=np.float32) if as_float else np.asanyarray(canonical.dataobj)
        zooms = tuple(float(z) for z in canonical.header.get_zooms()[:3])
    _require_finite(data, path, site, what)
    return NiftiVolume(data, zooms, stored)  # type: ignore[arg-type]


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


def _check_same_geometry(image: nib.Nifti1Image, mask: nib.Nifti1Image, rec: CaseRecord) -> None:
    """The mask must lie on the image's voxel grid: shape, spacing, direction and origin, compared from the stored
    affines (before reorientation, which would hide a mask stored flipped) within the tolerances above."""
    _check_same_shape(tuple(image.shape), tuple(mask.shape), rec)
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


def _check_labels(mask: np.ndarray, spec: LayoutSpec, rec: CaseRecord) -> None:
    """A NIfTI mask must hold non-negative integer labels."""
    if np.issubdtype(mask.dtype, np.floating) and (mask != np.round(mask)).any():
        raise DataError("mask has non-integer values (expected integer labels)", site=rec.site, paths=[rec.mask_path])
    if mask.size and mask.min() < 0:
        raise DataError(
            f"mask has negative values (min {mask.min()}); expected {spec.encoding}",
            site=rec.site, paths=[rec.mask_path],
        )


def _decode_saml(rec: CaseRecord, spec: LayoutSpec) -> Decoded:
    image = read_nifti(rec.image_path, what="image", site=rec.site)
    mask = read_nifti(rec.mask_path, what="mask", site=rec.site, as_float=False)
    _check_same_geometry(image.stored, mask.stored, rec)
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


_DECODERS = {"saml_nifti": _decode_saml, "slice_png": _decode_slice_png, "dofe_png": _decode_dofe_png}


def read_record(layout: str, rec: CaseRecord) -> Decoded:
    """Decode and validate one record at its original resolution (PNG: at most :data:`MAX_IMAGE_SIDE`).

    Raises DataError naming the site, the file(s) and the problem for: an unreadable or corrupt file (the OS's reason
    included), an image/mask shape mismatch, a NIfTI mask on another voxel grid than its image (spacing, direction,
    origin), a NIfTI file that is not a 3D volume or has NaN/Inf voxels, mask values outside the layout's encoding, a
    PNG mask with a non-constant alpha channel. Suspicious but usable input is in :attr:`Decoded.warnings`.
    """
    spec = layout_spec(layout)
    try:
        return _DECODERS[layout](rec, spec)
    except OSError as e:  # the readers turn OS errors into DataErrors; this catches any they miss
        raise DataError(f"cannot read ({os_reason(e)})", site=rec.site, paths=[rec.image_path, rec.mask_path]) from e
