"""What the scripts that read a benchmark results folder and write a report into it share (``ga_gaps.py``,
``mask_volume.py``): the folder checks, the writing of ``<name>.md`` and ``<name>.json``, and how numbers and a
difference with the seed as the unit are printed."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from feddg.benchmark.record import SWEEP_FILE
from feddg.benchmark.stats import PValue
from feddg.folders import guard_folder
from feddg.jsonfile import write_json


def report_folder(folder: Path, out: Path | None) -> Path:
    """Where the report of the results folder ``folder`` goes (``out``, else ``folder``), after the folder guard;
    ValueError, one line naming the folder, when the guard refuses it or ``folder`` is not a results folder."""
    target = guard_folder(out or folder, "--out", whole=False)  # two files of the report's own, replaced by name
    if not (folder / SWEEP_FILE).is_file():
        raise ValueError(f"{folder}: not a benchmark results folder (no {SWEEP_FILE})")
    return target


def write_report(out: Path, name: str, text: str, payload: Mapping[str, Any]) -> None:
    """``out/<name>.json`` (``payload``) and ``out/<name>.md`` (``text``, also printed); ValueError naming the file,
    and neither written, when ``payload`` holds NaN or an infinity (:func:`feddg.jsonfile.write_json`)."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / f"{name}.json", payload, indent=1, finite=True)  # first: the pair stays in step
    (out / f"{name}.md").write_text(text)
    print(text)


def number(value: float | None, signed: bool = False) -> str:
    return "-" if value is None else (f"{value:+.3f}" if signed else f"{value:.3f}")


def seed_difference(d: Mapping[str, Any] | None) -> str:
    """A :meth:`feddg.benchmark.stats.SeedDifference.to_dict`: its mean and seeds, with the interval and the paired
    t-test's p-value when the seeds give them; ``-`` without one."""
    if not d:
        return "-"
    text = f"{d['mean']:+.3f}"
    if d["low"] is not None:
        text += f" [{d['low']:+.3f}, {d['high']:+.3f}], t p {PValue(**d['p']).format()}"
    return f"{text} ({d['n_seeds']} seed{'' if d['n_seeds'] == 1 else 's'})"
