"""A read-only check of a data folder before a federated run: what is there, and every problem found.

``check_data`` never modifies anything and never stops at the first problem: each site is scanned, every paired
file is decoded with the same validation as training uses, and all problems are collected; a site whose folder
cannot even be listed is that site's problem, and the other sites are still checked. Suspicious but usable data
(a foreground share implausible for the task, an image larger than the task needs) is listed apart, as warnings,
with the same wording the loader logs. Statistics are over the *raw* data (before resizing and normalisation; PNG
images above :data:`~feddg.data.layouts.MAX_IMAGE_SIDE` after their 8-bit reduction), so that sites can be compared
as they are stored.

Run it from a shell: ``python -m feddg.data.check <layout> <root> [site ...]``.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from feddg.layouts import LAYOUTS, SPLIT_FOLDERS

from ..config import TASKS
from .errors import DataError, DataWarning
from .layouts import foreground_warnings, layout_spec, read_record, scan_site, site_folders


_SPLIT_ORDER = {"all": 0, "train": 1, "test": 2}


class _Stats:
    """Running min / max / mean / std of intensities, in float64."""

    def __init__(self) -> None:
        self.n = 0
        self.total = 0.0
        self.total_sq = 0.0
        self.lo = math.inf
        self.hi = -math.inf

    def add(self, x: np.ndarray) -> None:
        if x.size == 0:
            return
        self.n += x.size
        self.total += float(x.sum(dtype=np.float64))
        self.total_sq += float(np.square(x, dtype=np.float64).sum())
        self.lo = min(self.lo, float(x.min()))
        self.hi = max(self.hi, float(x.max()))

    def result(self) -> dict[str, float] | None:
        if not self.n:
            return None
        mean = self.total / self.n
        var = max(self.total_sq / self.n - mean * mean, 0.0)
        return {"min": self.lo, "max": self.hi, "mean": mean, "std": math.sqrt(var)}


class _Coverage:
    """Per structure: the share of 2D slices containing it and the mean share of their pixels it covers."""

    def __init__(self, structures: tuple[str, ...]) -> None:
        self.structures = structures
        self.slices = 0
        self.with_foreground = np.zeros(len(structures))
        self.fraction = np.zeros(len(structures))

    def add(self, labels: np.ndarray) -> None:
        """One decoded record's labels, (n, L, H, W)."""
        per_slice = labels.reshape(labels.shape[0], labels.shape[1], -1)
        self.slices += labels.shape[0]
        self.with_foreground += per_slice.any(axis=2).sum(axis=0)
        self.fraction += per_slice.mean(axis=2).sum(axis=0)

    def result(self) -> dict[str, dict[str, float | None]]:
        n = self.slices
        return {
            name: {
                "with_foreground": float(self.with_foreground[i] / n) if n else None,
                "mean_fraction": float(self.fraction[i] / n) if n else None,
            }
            for i, name in enumerate(self.structures)
        }


class _SplitTally:
    """One split folder ("all" for layouts without split folders): its counts, labelled pixels, stored shapes,
    intensities and label coverage."""

    def __init__(self, structures: tuple[str, ...]) -> None:
        self.structures = structures
        self.images = 0
        self.cases: set[str] = set()
        self.slices = 0
        self.foreground = np.zeros(len(structures))  # labelled pixels per structure
        self.pixels = 0
        self.shapes: set[tuple[int, ...]] = set()
        self.stats = _Stats()
        self.coverage = _Coverage(structures)

    def add(self, shape: tuple[int, ...], image: np.ndarray, labels: np.ndarray) -> None:
        """One decoded record: its stored shape, image and labels, (n, L, H, W)."""
        self.slices += labels.shape[0]
        self.foreground += labels.sum(axis=(0, 2, 3))
        self.pixels += labels.shape[0] * labels.shape[2] * labels.shape[3]
        self.shapes.add(shape)
        self.stats.add(image)
        self.coverage.add(labels)

    def share(self) -> dict[str, float]:
        """Structure -> its share of all pixels of the split."""
        return {name: float(self.foreground[i] / max(self.pixels, 1)) for i, name in enumerate(self.structures)}

    def counts(self) -> dict[str, int]:
        return {"images": self.images, "cases": len(self.cases), "slices": self.slices}

    def statistics(self) -> dict[str, Any]:
        """The split's own stored shapes, intensities and label coverage (see :func:`check_data`)."""
        return {"image_shapes": sorted(self.shapes), "intensity": self.stats.result(),
                "labels": self.coverage.result()}


def _missing_splits(layout: str, root: Path, site: str) -> list[DataError]:
    """For a layout with split folders, a problem for each one a site lacks while it has another (a site with none
    is the scan's problem): a federation needs every site's ``train/`` (training and validation) and ``test/`` (its
    in-domain test set, and the whole test set of a held-out site), so a site joining without one is refused here,
    before it joins."""
    site_dir = Path(root) / site
    try:
        if not layout_spec(layout).split_folders or not site_dir.is_dir():
            return []
        present = [s for s in SPLIT_FOLDERS if (site_dir / s).is_dir()]
    except OSError:  # a folder the OS refuses to look into: the scan reports it, naming it
        return []
    return [DataError(f"no {split}/ folder beside {', '.join(f'{p}/' for p in present)} (a site needs every one of "
                      f"{', '.join(f'{s}/' for s in SPLIT_FOLDERS)})", site=site, paths=[site_dir])
            for split in SPLIT_FOLDERS if present and split not in present]


def _check_site(layout: str, root: Path, site: str, structures: tuple[str, ...]) -> dict[str, Any]:
    """The report of one site (see :func:`check_data`)."""
    records, problems = scan_site(layout, root, site)
    problems += _missing_splits(layout, root, site)
    warnings: list[DataWarning] = []
    splits: dict[str, _SplitTally] = {}
    pooled = _SplitTally(structures)  # the whole site
    for rec in records:
        tally = splits.setdefault(rec.split or "all", _SplitTally(structures))
        tally.images += 1
        tally.cases.add(rec.case_id)
        try:
            d = read_record(layout, rec)
        except DataError as e:
            problems.append(e)
            continue
        warnings += d.warnings
        tally.add(d.shape, d.image, d.labels)
        pooled.add(d.shape, d.image, d.labels)
    for split, tally in splits.items():
        warnings += foreground_warnings(layout, site, split, tally.share())
    ordered = sorted(splits.items(), key=lambda kv: _SPLIT_ORDER.get(kv[0], 9))
    return {
        "splits": {k: v.counts() for k, v in ordered},
        **pooled.statistics(),
        "split_statistics": {k: v.statistics() for k, v in ordered},
        "problems": [str(p) for p in problems],
        "warnings": [str(w) for w in warnings],
    }


def check_data(layout: str, root: Path, sites: list[str] | None = None, task: str | None = None) -> dict[str, Any]:
    """Inspect a data folder read-only and report counts, sizes, intensities, label coverage and every problem.

    A problem at one site (even a folder the OS refuses to list) is that site's problem: the other sites are still
    checked. Warnings (an implausible foreground share, an oversized image) are listed apart and do not fail the check.

    Args:
        layout: one of the layouts declared in :data:`feddg.layouts.LAYOUTS`.
        root: the folder holding one subfolder per site.
        sites: the sites to check; None: every visible subfolder of ``root``.
        task: the expected task; a layout of another task is reported as a problem. None: the layout's own task.

    Returns:
        ``{"layout", "root", "task", "ok": bool, "problems": [str, ...] (all sites), "warnings": [str, ...] (all
        sites), "sites": {site: {"splits": {split: {"images": files/volumes, "cases": distinct cases, "slices": 2D
        slices}}, "image_shapes": [stored shape, ...], "intensity": {"min", "max", "mean", "std"} | None,
        "labels": {structure: {"with_foreground": share of 2D slices containing it, "mean_fraction": mean share of
        its pixels}}, "split_statistics": {split: {"image_shapes", "intensity", "labels"} of that split alone},
        "problems": [str, ...], "warnings": [str, ...]}}}``; the site's shapes, intensity and labels are over all its
        splits. Split ``"all"`` stands for layouts without split folders.
    """
    root = Path(root)
    report: dict[str, Any] = {
        "layout": layout, "root": str(root), "task": task, "sites": {}, "problems": [], "warnings": [],
    }
    try:
        spec = layout_spec(layout)
    except DataError as e:
        report["problems"].append(str(e))
        report["ok"] = False
        return report
    if task is not None and task != spec.task:
        report["problems"].append(str(DataError(f"layout {layout!r} holds {spec.task} data, not {task!r} data")))
    report["task"] = spec.task
    if sites is None:
        try:
            sites = site_folders(root)
        except DataError as e:
            report["problems"].append(str(e))
            sites = []
        else:
            if not sites:
                report["problems"].append(str(DataError("data root has no site folders", paths=[root])))
    structures = TASKS[spec.task][1]
    for site in sites:
        site_report = _check_site(layout, root, site, structures)
        report["sites"][site] = site_report
        report["problems"] += site_report["problems"]
        report["warnings"] += site_report["warnings"]
    report["ok"] = not report["problems"]
    return report


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.3g}%"


SHAPES_LISTED = 3  # more distinct image shapes than this are summarised (count, smallest, largest)


def describe_shapes(shapes: Sequence[Sequence[int]]) -> str:
    """Stored image shapes as text: each of up to :data:`SHAPES_LISTED` (``"384x384, 512x512"``), or a summary of
    more (``"37 sizes from 128x128 to 800x800"``, the smallest and largest by pixel count); "-" for none."""
    ordered = sorted({tuple(s) for s in shapes}, key=lambda s: (math.prod(s), s))
    names = ["x".join(map(str, s)) for s in ordered]
    if len(names) <= SHAPES_LISTED:
        return ", ".join(names) or "-"
    return f"{len(names)} sizes from {names[0]} to {names[-1]}"


def format_report(report: dict[str, Any]) -> str:
    """A plain-text table of a :func:`check_data` report, a row per site and split with that split's own counts,
    shapes, intensities and labels, then the warnings and the problems, each under a heading."""
    lines = [f"data check: layout {report['layout']}, task {report['task']}, root {report['root']}"]
    header = ["site", "split", "images", "cases", "slices", "shapes", "min", "max", "mean", "std", "labels"]
    rows = [header]
    for site, r in report["sites"].items():
        splits = r["splits"] or {"-": {"images": 0, "cases": 0, "slices": 0}}
        for i, (split, c) in enumerate(splits.items()):
            own = r.get("split_statistics", {}).get(split, {})
            it = own.get("intensity") or {}
            labels = "; ".join(
                f"{name}: {_pct(v['with_foreground'])} of slices, {_pct(v['mean_fraction'])} of pixels"
                for name, v in (own.get("labels") or {}).items()
            )
            rows.append([site if i == 0 else "", split, str(c["images"]), str(c["cases"]), str(c["slices"]),
                         describe_shapes(own.get("image_shapes", [])), _fmt(it.get("min")), _fmt(it.get("max")),
                         _fmt(it.get("mean")), _fmt(it.get("std")), labels or "-"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for j, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    if report.get("warnings"):
        lines.append(f"{len(report['warnings'])} warning(s) (suspicious but usable data, not counted as problems):")
        lines += [f"  - {w}" for w in report["warnings"]]
    if report["problems"]:
        lines.append(f"{len(report['problems'])} problem(s):")
        lines += [f"  - {p}" for p in report["problems"]]
    else:
        lines.append("no problems found")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m feddg.data.check <layout> <root> [site ...]``: print the report; exit status 1 on problems."""
    parser = argparse.ArgumentParser(description="Check a FedDG data folder (read-only).")
    parser.add_argument("layout", choices=list(LAYOUTS))
    parser.add_argument("root", type=Path)
    parser.add_argument("sites", nargs="*")
    parser.add_argument("--task", default=None)
    args = parser.parse_args(argv)
    report = check_data(args.layout, args.root, args.sites or None, args.task)
    print(format_report(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
