"""Finding a site's image/mask pairs: :func:`scan_site` (every problem, never raising for data) and
:func:`discover_site` (the pairs, or the first problem raised), plus the pairing rules the layouts' scanners share.

Images and masks are paired by file name only: an image whose mask is missing is an error, never paired with a
neighbouring slice's mask. Reads no pixel data.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from feddg.layouts import SPLIT_FOLDERS, Layout

from ..errors import DataError, os_reason
from .files import exists, is_dir, list_dir, site_folders
from .records import CaseRecord
from .registry import implementation, layout_spec

Found = tuple[list[CaseRecord], list[DataError]]  # the records found and every problem found


def strip_suffix(name: str, suffixes: tuple[str, ...]) -> str | None:
    """``name`` without the first of ``suffixes`` it ends in (compared in lower case); None when it ends in none."""
    low = name.lower()
    for suffix in suffixes:
        if low.endswith(suffix):
            return name[: -len(suffix)]
    return None


def entries(folder: Path, suffixes: tuple[str, ...], site: str) -> tuple[list[tuple[str, Path]], list[DataError]]:
    """The visible files in ``folder`` ending in one of ``suffixes``: (name without the suffix, path), in name order.

    Entries that cannot be read as files (a dangling or looping symbolic link, one the OS refuses to examine, a
    device or pipe) are listed too, so that their partner is not called unpaired, and each gets a DataError.
    Folders are left out. Raises DataError when ``folder`` cannot be listed.
    """
    found: list[tuple[str, Path]] = []
    problems: list[DataError] = []
    for p in list_dir(folder, site):
        stem = strip_suffix(p.name, suffixes)
        if stem is None or p.name.startswith("."):
            continue  # readme files and the like
        try:
            if not exists(p, site) or p.is_dir():
                continue  # removed meanwhile, or a folder
            if not p.is_file():
                problems.append(DataError("not a regular file", site=site, paths=[p]))
        except DataError as e:
            problems.append(e)
        found.append((stem, p))
    return found, problems


def unusable(problems: list[DataError]) -> set[Path]:
    """Every path a problem names (already reported, so left out of the pairs)."""
    return {Path(p) for e in problems for p in e.paths}


def _name_list(paths: list[Path], limit: int = 10) -> str:
    names = [p.name for p in paths[:limit]]
    more = f" and {len(paths) - limit} more" if len(paths) > limit else ""
    return ", ".join(names) + more


def pair(
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


def _first_by_key(found: list[tuple[str, Path]]) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for key, p in found:
        out.setdefault(key, p)
    return out


def _scan_split(layout: Layout, site_dir: Path, site: str, split: str, case_of: Callable[[str], str]) -> Found:
    """One split folder of a layout with split folders; DataError when one of its folders cannot be examined or
    listed."""
    list_dir(site_dir / split, site)  # an unreadable split folder is named as such, not by a file below it
    image_dir = site_dir.joinpath(split, *layout.image_folder)
    mask_dir = site_dir.joinpath(split, *layout.mask_folder)
    missing = [d for d in (image_dir, mask_dir) if not is_dir(d, site)]
    if missing:
        return [], [DataError("folder is missing", site=site, paths=missing)]
    images, image_problems = entries(image_dir, layout.suffixes, site)
    masks, mask_problems = entries(mask_dir, layout.suffixes, site)
    problems = image_problems + mask_problems
    pairs, unpaired = pair(_first_by_key(images), _first_by_key(masks), site, unusable(problems))
    return [CaseRecord(site, case_of(key), split, img, msk) for key, img, msk in pairs], problems + unpaired


def scan_split_folders(layout: Layout, site_dir: Path, site: str, case_of: Callable[[str], str]) -> Found:
    """A layout with split folders: ``<site_dir>/<split>/<image_folder>/<name><suffix>`` paired with the mask of the
    same name in ``<mask_folder>``, for each split folder present; ``case_of``: file name stem -> case id."""
    records: list[CaseRecord] = []
    problems: list[DataError] = []
    splits = []
    for split in SPLIT_FOLDERS:
        try:
            if is_dir(site_dir / split, site):
                splits.append(split)
        except DataError as e:
            problems.append(e)
    if not splits and not problems:
        expected = "/".join(("{" + ",".join(SPLIT_FOLDERS) + "}",) + layout.image_folder)
        folders = " or ".join(f"{split}/" for split in SPLIT_FOLDERS)
        reason = f"no {folders} folder (expected <site>/{expected}/*{layout.suffixes[0]})"
        problems.append(DataError(reason, site=site, paths=[site_dir]))
    for split in splits:
        try:
            found, split_problems = _scan_split(layout, site_dir, site, split, case_of)
        except DataError as e:
            found, split_problems = [], [e]
        records += found
        problems += split_problems
    return records, problems


def _missing_site(root: Path, site: str, site_dir: Path) -> DataError:
    try:
        where = f"folders under the root: {site_folders(root)}"
    except DataError as e:
        where = e.reason
    return DataError(f"site folder is missing ({where})", site=site, paths=[site_dir])


_SPLIT_ORDER = {None: 0, **{split: i for i, split in enumerate(SPLIT_FOLDERS)}}


def scan_site(layout: str, root: Path, site: str) -> Found:
    """Find a site's image/mask pairs without raising for data problems.

    Returns the paired records (sorted by split, case, file name) and every problem found: missing or empty site
    folder, missing image/mask folders, unpaired files, duplicate cases, symbolic links that cannot be followed, and
    folders or files the OS refuses to list or examine. Raises DataError only for an unknown layout.
    """
    spec = layout_spec(layout)
    site_dir = Path(root) / site
    try:
        if not is_dir(site_dir, site):
            return [], [_missing_site(Path(root), site, site_dir)]
        list_dir(site_dir, site)  # an unreadable site folder is named as such, not by a folder below it
        records, problems = implementation(spec.scanner)(spec, site_dir, site)
    except DataError as e:
        return [], [e]
    except OSError as e:  # the helpers above turn the OS's refusals into DataErrors; this catches any they miss
        where = e.filename if e.filename else site_dir
        return [], [DataError(f"cannot read the site folder ({os_reason(e)})", site=site, paths=[where])]
    if not records and not problems:
        problems.append(DataError(f"site folder has no images for layout {layout}", site=site, paths=[site_dir]))
    records.sort(key=lambda r: (_SPLIT_ORDER[r.split], r.case_id, r.image_path.name))
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
