"""What the runs of a results folder scored: their records, a tidy CSV of every score, and per cell (method,
held-out site) each seed's held-out value and per-case Dice, the material of the tables and tests
(:mod:`feddg.benchmark.tables`).

Scores are the held-out site's test split of each run's reported model (``report["reported_model"]``: the final
global model, the papers' choice, or the model a method reports instead, MLA-BIN's attention-combined one); the CSV
also has the best model. A fundus case's Dice for the statistics is the mean of its disc and cup Dice, the papers'
"mean" column.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from feddg.benchmark.record import INTERRUPTED, run_records
from feddg.flare.payloads import CASES


METRICS = ("dice", "hd95", "asd")


CSV_FIELDS = ["task", "method", "held_out", "seed", "status", "model", "site", "role", "split", "structure",
              "metric", "mean", "std", "n_cases"]


def load_records(out: Path) -> list[dict[str, Any]]:
    """Every run's record in a results folder, in run-id order; an interrupted run is not a result (it is run again
    on resume), and shows as not run."""
    return [r for r in run_records(out, scores=True).values() if r.get("status") != INTERRUPTED]


def label_names(record: dict[str, Any]) -> list[str]:
    from feddg.experiment import experiment_from_dict
    from feddg.flare import registry  # noqa: F401 - registers the methods' feddg.yaml sections

    return list(experiment_from_dict(record["config"]).data.label_names)


def reported_model(record: dict[str, Any]) -> str:
    return record["report"].get("reported_model", "final")


def held_out_summary(record: dict[str, Any], model: str | None = None) -> dict[str, Any] | None:
    """The held-out site's test summary of ``model`` (default: the reported one); None when it is missing."""
    if record.get("status") != "ok":
        return None
    report = record["report"]
    evaluation = report.get("models", {}).get(model or reported_model(record)) or {}
    site = evaluation.get("sites", {}).get(record["run"]["held_out"]) or {}
    return site.get("splits", {}).get("test")


def case_dice(record: dict[str, Any], model: str | None = None) -> np.ndarray | None:
    """(n_cases,) each held-out case's Dice averaged over the structures, of ``model`` (default: the reported one);
    None without per-case scores."""
    summary = held_out_summary(record, model)
    if not summary or CASES not in summary:
        return None
    names = label_names(record)
    cases = summary[CASES]
    return np.array([np.mean([cases[str(i)][n]["dice"] for n in names]) for i in range(len(cases))])


def tidy_rows(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per run x site x split x structure x metric (a failed run: one row with its status)."""
    rows = []
    for r in records:
        run = r["run"]
        base = {"task": run["task"], "method": run["method"], "held_out": run["held_out"], "seed": run["seed"],
                "status": r["status"]}
        if r["status"] != "ok":
            rows.append({**base, **{k: "" for k in CSV_FIELDS if k not in base}})
            continue
        names = label_names(r)
        for model, evaluation in r["report"].get("models", {}).items():
            # Sites by name: the report lists them in order of arrival, which differs between identical runs.
            for site, entry in sorted(evaluation.get("sites", {}).items()):
                for split, summary in sorted(entry.get("splits", {}).items()):
                    for name in names:
                        for metric in METRICS:
                            rows.append({**base, "model": model, "site": site, "role": entry.get("role", ""),
                                         "split": split, "structure": name, "metric": metric,
                                         "mean": summary[name][metric]["mean"], "std": summary[name][metric]["std"],
                                         "n_cases": summary[name]["n_cases"]})
    return rows


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(rows)


def cells(records: Sequence[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """(method, held-out site) -> {"values": {(structure or "mean", metric): [one value per seed]},
    "seeds": [...], "failed": [seeds]}: each finished seed's held-out summary, in seed order."""
    out: dict[tuple[str, str], dict[str, Any]] = defaultdict(lambda: {"values": defaultdict(list), "seeds": [],
                                                                      "failed": []})
    for r in sorted(records, key=lambda r: int(r["run"]["seed"])):
        key = (r["run"]["method"], r["run"]["held_out"])
        summary = held_out_summary(r)
        if summary is None:
            out[key]["failed"].append(r["run"]["seed"])
            continue
        out[key]["seeds"].append(r["run"]["seed"])
        names = label_names(r)
        for metric in METRICS:
            per_structure = [summary[n][metric]["mean"] for n in names]
            for n, v in zip(names, per_structure):
                out[key]["values"][(n, metric)].append(v)
            if len(names) > 1:
                out[key]["values"][("mean", metric)].append(float(np.mean(per_structure)))
    return {k: {**v, "values": dict(v["values"])} for k, v in out.items()}


def seed_dice(records: Sequence[dict[str, Any]]) -> dict[tuple[str, str], dict[int, float]]:
    """(method, held-out site) -> {seed: held-out Dice (mean over the structures)} of every finished run, read from
    :func:`cells` (whose values are in seed order)."""
    out = {}
    for key, cell in sorted(cells(records).items()):
        per_structure = [v for (view, metric), v in cell["values"].items() if metric == "dice" and view != "mean"]
        if cell["seeds"]:
            out[key] = dict(sorted((int(s), float(np.mean(v))) for s, *v in zip(cell["seeds"], *per_structure)))
    return out


def seed_spread(records: Sequence[dict[str, Any]]) -> dict[tuple[str, str], dict[int, float]]:
    """:func:`seed_dice` of the cells run with two seeds or more: what retraining alone changes."""
    return {k: v for k, v in seed_dice(records).items() if len(v) > 1}


def pooled_seed_sd(spread: dict[tuple[str, str], dict[int, float]]) -> dict[str, Any] | None:
    """The seed SD of held-out Dice pooled over the cells of :func:`seed_spread` (two seeds or more): the square
    root of the mean of the cells' variances over seeds (ddof 1), i.e. how far retraining alone moves one trained
    model's score; with the number of cells and of runs it pools. None when no cell has two seeds."""
    if not spread:
        return None
    variances = [float(np.var(list(v.values()), ddof=1)) for v in spread.values()]
    return {"sd": math.sqrt(float(np.mean(variances))), "cells": len(spread),
            "runs": sum(len(v) for v in spread.values())}


def case_scores(records: Sequence[dict[str, Any]]) -> dict[tuple[str, str], dict[int, np.ndarray]]:
    """(method, held-out site) -> seed -> that run's per-case held-out Dice (runs without per-case scores, which a
    site's policy can refuse, are left out)."""
    out: dict[tuple[str, str], dict[int, np.ndarray]] = defaultdict(dict)
    for r in records:
        scores = case_dice(r)
        if scores is not None:
            out[(r["run"]["method"], r["run"]["held_out"])][int(r["run"]["seed"])] = scores
    return dict(out)
