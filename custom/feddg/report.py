"""The leave-one-site-out report: a JSON document and a plain-text table built from metric summaries.

Pure functions over dictionaries; the server workflow and the standalone evaluation command both use them.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import shlex
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from feddg.numerics import cpu_model

# The report's file name in the server's run folder: written by the rounds' workflow (and MLA's phase), read by
# the POC, the network rehearsal and the benchmark sweep. Defined here, in the layer below the NVFlare glue, so
# that every module that writes or reads the report names it from one place.
REPORT_FILE = "feddg_report.json"


def software_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for dist in ("feddg-flare", "nvflare", "torch", "monai", "numpy"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "not installed"
    return versions


def code_fingerprint() -> str:
    """SHA-256 over the package's Python sources (relative path and bytes of every ``feddg/**/*.py``, sorted): two
    runs with the same fingerprint ran the same code, whatever the version string says (a result set holds one)."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def machine_info() -> dict[str, Any]:
    """The machine a measurement ran on: CPU model, usable cores, GPU (if torch sees one)."""
    from feddg.compute import available_cores

    info: dict[str, Any] = {"cpu": cpu_model(), "cores": available_cores()}
    try:
        import torch

        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def script_command(script: str, argv: Sequence[str] | None = None) -> str:
    """The command that repeats a benchmark script's run, as its outputs state it: ``python <script>`` and the
    arguments (``sys.argv[1:]`` when ``argv`` is None), each quoted where a shell needs it, so that pasting it
    runs the same thing (``shlex.split`` gives the arguments back)."""
    return shlex.join(["python", script, *(sys.argv[1:] if argv is None else argv)])


def site_rows(
    model_name: str, site: str, role: str, splits: dict[str, dict[str, Any]], label_names: Sequence[str]
) -> Iterable[dict[str, Any]]:
    """One flat row per (split, structure) of one site's evaluation."""
    for split, summary in splits.items():
        for name in label_names:
            m = summary[name]
            yield {
                "model": model_name, "site": site, "role": role, "split": split, "structure": name,
                "dice": m["dice"]["mean"], "dice_std": m["dice"]["std"],
                "hd95": m["hd95"]["mean"], "hd95_std": m["hd95"]["std"],
                "asd": m["asd"]["mean"], "asd_std": m["asd"]["std"],
                "n": m["n_cases"], "empty_pred": m["empty_pred"], "empty_gt": m["empty_gt"],
                "unit": summary["unit"],
            }


def evaluation_rows(
    evaluations: Mapping[str, dict[str, Any]], site_order: Sequence[str], label_names: Sequence[str]
) -> list[dict[str, Any]]:
    """The table rows of several models' evaluations ({model: {"sites": {site: {"role", "splits"}}}}): model by
    model, sites in ``site_order``."""
    rows: list[dict[str, Any]] = []
    for name, evaluation in evaluations.items():
        for site in site_order:
            entry = evaluation["sites"].get(site)
            if entry:
                rows.extend(site_rows(name, site, entry["role"], entry["splits"], label_names))
    return rows


def compare_models(rows: Sequence[dict[str, Any]], site: str, split: str, models: Sequence[str]) -> list[str]:
    """One line per structure: Dice, HD95 and ASD of each of ``models`` side by side at one site and split
    (models without a row there are left out)."""
    lines = []
    structures = list(dict.fromkeys(r["structure"] for r in rows if r["site"] == site and r["split"] == split))
    for structure in structures:
        found = {r["model"]: r for r in rows
                 if r["site"] == site and r["split"] == split and r["structure"] == structure}
        present = [m for m in models if m in found]
        if not present:
            continue
        unit = found[present[0]]["unit"]
        parts = [f"{metric} " + " / ".join(f"{m} {found[m][key]:.{digits}f}" for m in present)
                 for metric, key, digits in (("Dice", "dice", 3), (f"HD95 ({unit})", "hd95", 2),
                                             (f"ASD ({unit})", "asd", 2))]
        lines.append(f"{site} {split} {structure}: " + "; ".join(parts))
    return lines


def sites_absent(report: Mapping[str, Any], sites: Sequence[str], unseen: str) -> str | None:
    """Why a job's report is not a run of all its sites, None when it is: the first round whose aggregation lacked a
    training site (``history[].sites``), or the unseen site missing from the final model's evaluation. A run can
    finish that way when a site's process never asks for its tasks (NVFlare 2.9's simulator could name two site
    processes after one site: :mod:`feddg.flare.simulator`) and the rounds go on with the sites present."""
    training = [s for s in sites if s != unseen]
    for entry in report.get("history", []):
        missing = [s for s in training if s not in entry.get("sites", [])]
        if missing:
            return f"round {entry.get('round')} aggregated without {', '.join(missing)}"
    evaluated = report.get("models", {}).get("final", {}).get("sites", {})
    if unseen not in evaluated:
        return f"the final model was not evaluated at the unseen site {unseen}"
    return None


def write_report(path: str | os.PathLike, report: Mapping[str, Any]) -> None:
    """Write the JSON report atomically (a sibling temporary file renamed into place); NaN is refused."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=2, allow_nan=False, default=float)
    os.replace(tmp, path)


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """Fixed-width table: Dice, HD95 and ASD as mean +- std per model, site, split and structure."""
    header = f"{'model':<6} {'site':<10} {'role':<6} {'split':<5} {'structure':<9} " \
             f"{'Dice':>13} {'HD95':>15} {'ASD':>15} {'unit':>4} {'n':>4} {'empty p/g':>9}"
    lines = [header, "-" * len(header)]

    def pm(mean: float, std: float, width: int, digits: int) -> str:
        return f"{mean:.{digits}f}+-{std:.{digits}f}".rjust(width)

    for r in rows:
        lines.append(
            f"{r['model']:<6} {r['site']:<10} {r['role']:<6} {r['split']:<5} {r['structure']:<9} "
            f"{pm(r['dice'], r['dice_std'], 13, 3)} {pm(r['hd95'], r['hd95_std'], 15, 2)} "
            f"{pm(r['asd'], r['asd_std'], 15, 2)} {r['unit']:>4} {r['n']:>4} "
            f"{str(r['empty_pred']) + '/' + str(r['empty_gt']):>9}"
        )
    return "\n".join(lines)


def mean_of(values: Iterable[float]) -> float:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return sum(values) / len(values) if values else math.nan
