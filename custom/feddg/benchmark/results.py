"""The sweep's outputs from its runs' records: a tidy CSV, the papers' tables with seed-level differences to the
baselines, plots, and one JSON with every number.

Scores are the held-out site's test split of each run's reported model (``report["reported_model"]``: the final
global model, the papers' choice, or the model a method reports instead, MLA-BIN's attention-combined one); the CSV
also has the best model. A table cell is the mean over the cell's training seeds with their SD and count. The
comparisons treat the seed as the unit (:mod:`feddg.benchmark.stats`): seed k of a method is paired with seed k of
the baseline, never averaged with other seeds before a comparison. A fundus case's Dice for the statistics is the
mean of its disc and cup Dice, the papers' "mean" column.
"""

from __future__ import annotations

import csv
import json
import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from feddg.benchmark.cost import PAPER_ROUND_TIME, cost_line, paper_size_cost
from feddg.benchmark.stats import ALPHA, DIFFERENCE_THAT_MATTERS, MIN_SEEDS, SeedDifference, compare_seeds, holm
from feddg.benchmark.record import (INTERRUPTED, RUN_FILE, SWEEP_FILE, Design, designed, finished, run_cpu,
                                    run_family, run_records)
from feddg.flare.payloads import CASES
from feddg.jsonfile import read_json, write_json
from feddg.layouts import LAYOUTS

BASELINE = "fedavg"
# The baselines every method is compared with, where the folder ran them: FedAvg, and its equal-weight control
# (the GA paper's step-0 control; gradient alignment also averages its corrected updates with equal weights).
BASELINES = (BASELINE, "uniform")
METRICS = ("dice", "hd95", "asd")
CSV_FIELDS = ["task", "method", "held_out", "seed", "status", "model", "site", "role", "split", "structure",
              "metric", "mean", "std", "n_cases"]


# The fields of a run record that results.json repeats (the rest is read from the run's own run.json).
RUN_SUMMARY = ("run", "run_id", "status", "reason", "wall_s", "ended_at", "log", "simulator_args", "code", "executor")


def load_records(out: Path) -> list[dict[str, Any]]:
    """Every run's record in a results folder, in run-id order; an interrupted run is not a result (it is run again
    on resume), and shows as not run."""
    return [r for r in run_records(out, scores=True).values() if r.get("status") != INTERRUPTED]


def label_names(record: dict[str, Any]) -> list[str]:
    from feddg.flare.registry import experiment_from_dict

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


def case_dice(record: dict[str, Any]) -> np.ndarray | None:
    """(n_cases,) each held-out case's Dice averaged over the structures; None without per-case scores."""
    summary = held_out_summary(record)
    if not summary or CASES not in summary:
        return None
    names = label_names(record)
    cases = summary[CASES]
    return np.array([np.mean([cases[str(i)][n]["dice"] for n in names]) for i in range(len(cases))])


# ------------------------------------------------------------------------------------------------ CSV


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


# ------------------------------------------------------------------------------------------------ cells


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


# ------------------------------------------------------------------------------------------------ statistics


def case_scores(records: Sequence[dict[str, Any]]) -> dict[tuple[str, str], dict[int, np.ndarray]]:
    """(method, held-out site) -> seed -> that run's per-case held-out Dice (runs without per-case scores, which a
    site's policy can refuse, are left out)."""
    out: dict[tuple[str, str], dict[int, np.ndarray]] = defaultdict(dict)
    for r in records:
        scores = case_dice(r)
        if scores is not None:
            out[(r["run"]["method"], r["run"]["held_out"])][int(r["run"]["seed"])] = scores
    return dict(out)


def comparisons(records: Sequence[dict[str, Any]], baseline: str = BASELINE, held_out: Sequence[str] | None = None,
                n_resamples: int = 9999) -> dict[str, Any]:
    """Each method against ``baseline`` with seeds as the unit (:func:`feddg.benchmark.stats.compare_seeds`): at
    every held-out site over the seeds both have run, and over all the ``held_out`` sites (default: every site of
    the records) when each of them has paired seeds; Holm-adjusted p-values across the methods' averages."""
    scores = case_scores(records)
    sites = list(held_out) if held_out is not None else sorted({s for _, s in scores})
    methods = sorted({m for m, _ in scores} - {baseline})
    roots = {(r.get("config", {}).get("data") or {}).get("root") for r in finished(records)}
    out: dict[str, Any] = {"baseline": baseline, "sites": sites, "methods": {},
                           "data": "synthetic" if roots <= {None} else "real"}
    paired_by_method = {}
    for method in methods:
        paired: dict[str, dict[int, tuple[np.ndarray, np.ndarray]]] = {}
        for site in sites:
            mine, base = scores.get((method, site), {}), scores.get((baseline, site), {})
            both = {k: (mine[k], base[k]) for k in sorted(set(mine) & set(base))}
            if both:
                paired[site] = both
        if paired:
            paired_by_method[method] = paired
    # The averages are one family, Holm-adjusted: their power is stated at the level of Holm's strictest step,
    # alpha / m, so that "resolvable" means resolvable after the correction.
    family = sum(len(p) == len(sites) for p in paired_by_method.values())
    cpu = {(r["run"]["method"], r["run"]["held_out"], int(r["run"]["seed"])): run_family(r)
           for r in finished(records)}
    for method, paired in paired_by_method.items():
        entry: dict[str, Any] = {"sites": {s: compare_seeds({s: p}, n_resamples=n_resamples)
                                           for s, p in paired.items()}}
        # A pair whose two runs were made on different CPU families compares the CPU too (a run repeats only on its
        # family: feddg.numerics.numbers_family): marked until it is re-run on one family.
        crossed = {s: [{"seed": k, method: cpu.get((method, s, k)), baseline: cpu.get((baseline, s, k))}
                       for k in p if cpu.get((method, s, k)) != cpu.get((baseline, s, k))]
                   for s, p in paired.items()}
        entry["cross_cpu"] = {s: pairs for s, pairs in crossed.items() if pairs}
        if len(paired) == len(sites):
            entry["average"] = compare_seeds(paired, n_resamples=n_resamples, alpha=ALPHA / family)
        out["methods"][method] = entry
    out["family"] = family
    adjusted = holm({m: e["average"].p for m, e in out["methods"].items() if "average" in e
                     and e["average"].p is not None})
    for m, p in adjusted.items():
        out["methods"][m]["holm_p"] = p
    return out


def verdict(method: str, entry: dict[str, Any], baseline: str, n_sites: int, family: int = 1,
            data: str = "synthetic") -> str:
    """One sentence on what the evidence supports for ``method`` against ``baseline`` on the average column, or,
    for a method not yet compared at every held-out site, each site's difference so far (its p-value not
    Holm-adjusted); generated from the comparison (the benchmark page docs/benchmark.md quotes these; no
    interpretation is typed). It names the test (the paired t-test over the seeds, the seed as the unit:
    :mod:`feddg.benchmark.stats`), the seeds, how many sites the method is ahead at, and what the verdict is
    conditional on: these held-out sites, of ``data`` ("synthetic" or "real")."""
    if "average" not in entry:  # a folder made a part at a time: what each site run so far shows, unadjusted
        sites = "; ".join(f"{site} {d.format()}" + (f", paired t p {d.p.format()} (not Holm-adjusted)"
                                                    if d.p is not None else "")
                          for site, d in entry["sites"].items())
        return (f"**{method}** vs {baseline}: compared at {len(entry['sites'])} of {n_sites} held-out sites only, "
                f"no average: {sites}.")
    average: SeedDifference = entry["average"]
    p = entry.get("holm_p")
    where = f"on these {n_sites} held-out sites ({data} data)"
    ahead = f"ahead at {average.sites_ahead} of {n_sites} sites"
    if not average.has_interval:
        return (f"**{method}** vs {baseline}: {average.format()}, {ahead}: not resolved, fewer than {MIN_SEEDS} "
                f"seeds run at every site.")
    head = (f"**{method}** vs {baseline}: {average.format()}, {ahead}; paired t over the {average.n_seeds} seeds' "
            f"site averages, Holm p {p.format()} (sign-flip p {average.flip_p.format()}, its floor "
            f"{average.min_p:.3g})")
    if average.resolved(p):
        side = "ahead of" if average.mean > 0 else "behind"
        return f"{head}: {side} {baseline} on the average, {where}."
    if average.mde is None:
        reach = f"no spread to judge at {average.n_seeds} seeds"
    else:
        reach = (f"these seeds resolve differences of about {average.mde:.3f} or more (80% power, paired t after "
                 f"Holm over {family})")
    need = ("" if average.seeds_for_target is None else
            f"; {DIFFERENCE_THAT_MATTERS} would take about {average.seeds_for_target} seeds")
    return f"{head}: not resolved at {average.n_seeds} seeds, {where}; {reach}{need}."


# ------------------------------------------------------------------------------------------------ tables


def _views(records: Sequence[dict[str, Any]]) -> list[str]:
    names = next((label_names(r) for r in finished(records)), ["dice"])
    return names + (["mean"] if len(names) > 1 else [])


def _fmt(value: float | None, metric: str) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.3f}" if metric == "dice" else f"{value:.2f}"


def _cell(values: Sequence[float], metric: str) -> str:
    """Mean over seeds, its seed SD and the seed count: ``0.589 ± 0.049 (5)``; one seed: ``0.589 (1)``."""
    if len(values) < 2:
        return f"{_fmt(values[0], metric)} (1)"
    return f"{_fmt(float(np.mean(values)), metric)} ± {_fmt(float(np.std(values, ddof=1)), metric)} ({len(values)})"


def markdown(records: Sequence[dict[str, Any]], stats: Sequence[dict[str, Any]], methods: Sequence[str],
             held_out: Sequence[str], spent: dict[str, Any] | None = None,
             spread: dict[tuple[str, str], dict[int, float]] | None = None) -> str:
    """The papers' layout: rows methods, columns each held-out site and the average; one table per metric and
    structure (fundus: disc, cup, their mean), each cell the mean over seeds ± the seed SD (seed count); then each
    seed's held-out Dice, the differences to each baseline in ``stats`` and what the evidence supports, opened by
    :func:`evidence_basis` (``spent``, ``spread``: :func:`machine_time` and :func:`seed_spread` of ``records``
    when the caller has them already)."""
    table = cells(records)
    spread = seed_spread(records) if spread is None else spread
    pooled = pooled_seed_sd(spread)
    layouts = {r.get("config", {}).get("data", {}).get("layout") for r in records}
    unit = "mm" if any(name in LAYOUTS and LAYOUTS[name].volumes for name in layouts) else "px"  # volumes: voxel mm
    lines = []
    for metric in METRICS:
        for view in _views(records):
            title = {"dice": "Dice", "hd95": f"HD95 ({unit})", "asd": f"ASD ({unit})"}[metric]
            lines += [f"### {title}, {view} (mean over seeds ± seed SD (seeds))", "",
                      "| method | " + " | ".join(held_out) + " | average |", "|---|" + "---|" * (len(held_out) + 1)]
            for method in methods:
                row, means = [], []
                for site in held_out:
                    cell = table.get((method, site))
                    values = [] if cell is None else cell["values"].get((view, metric), [])
                    if not values:
                        row.append("failed" if cell is not None and cell["failed"] else "not run")
                        continue
                    row.append(_cell(values, metric))
                    means.append(float(np.mean(values)))
                average = float(np.mean(means)) if len(means) == len(held_out) else None
                lines.append(f"| {method} | " + " | ".join(row) + f" | {_fmt(average, metric)} |")
            lines.append("")
    if pooled:
        seeds = sorted({seed for per_seed in spread.values() for seed in per_seed})
        lines += ["### Seed values: held-out Dice of each training seed", "",
                  f"Pooled seed SD {pooled['sd']:.3f} (over {_plural(pooled['cells'], 'cell')}, "
                  f"{_plural(pooled['runs'], 'run')}: the root of the mean of the cells' variances over seeds): "
                  f"{RETRAINING}.", "",
                  "| method | held-out | " + " | ".join(f"seed {s}" for s in seeds) + " | max - min |",
                  "|---|---|" + "---|" * (len(seeds) + 1)]
        for (method, site), per_seed in spread.items():
            lines.append(f"| {method} | {site} | " + " | ".join(_fmt(per_seed.get(s), "dice") for s in seeds)
                         + f" | {max(per_seed.values()) - min(per_seed.values()):.3f} |")
        lines.append("")
    for comparison in stats:
        base = comparison["baseline"]
        lines += [f"### Dice difference to {base} (the seed as the unit: mean paired seed difference, 95% crossed "
                  f"bootstrap interval, seeds, SD of the seeds' differences (average: of their site averages); no "
                  f"interval below {MIN_SEEDS} seeds; p: paired t-test over the seeds, Holm-adjusted over the "
                  f"methods)", "",
                  "| method | " + " | ".join(held_out) + " | average | Holm p (average) |",
                  "|---|" + "---|" * (len(held_out) + 2)]
        for method, entry in comparison["methods"].items():
            row = [entry["sites"][s].format() + (" †" if s in entry.get("cross_cpu", {}) else "")
                   if s in entry["sites"] else "not run" for s in held_out]
            average = entry["average"].format() if "average" in entry else "-"
            holm_p = entry["holm_p"].format() if "holm_p" in entry else "-"
            lines.append(f"| {method} | " + " | ".join(row) + f" | {average} | {holm_p} |")
        crossed = [f"{method} at {site}, seed{'s' if len(pairs) > 1 else ''} "
                   f"{', '.join(str(p['seed']) for p in pairs)} ({pairs[0][method]} against {pairs[0][base]})"
                   for method, entry in comparison["methods"].items()
                   for site, pairs in entry.get("cross_cpu", {}).items()]
        if crossed:
            lines += ["", f"† pairs whose two runs were made on different CPU families (maker and kernels), which "
                          f"alone move a run: {'; '.join(crossed)}. Marked until re-run on one family."]
        lines.append("")
    scored = {r["run"]["method"] for r in finished(records)}
    unfinished = [f"- **{method}**: " + ("every run failed (see the runs' run.json)." if
                                          any(m == method for m, _ in table) else "not run yet.")
                  for method in methods if method not in scored]
    if stats or unfinished:
        lines += ["### What the evidence supports (generated from the table above)", "",
                  evidence_basis(records, len(methods) * len(held_out),
                                 machine_time(records) if spent is None else spent, pooled), ""]
        for comparison in stats:
            for method, entry in comparison["methods"].items():
                line = verdict(method, entry, comparison["baseline"], len(held_out), comparison["family"],
                               comparison["data"])
                lines.append(f"- {line}")
        lines += unfinished
        lines.append("")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ plots


def plots(records: Sequence[dict[str, Any]], out: Path, methods: Sequence[str], held_out: Sequence[str]) -> list[Path]:
    """PNG plots: validation Dice per round per method; each kept server file's plot (GA's weights over rounds);
    held-out Dice per site (bars: mean over seeds, error bars: seed SD, dots: each seed)."""
    import importlib

    import matplotlib

    from feddg.flare.registry import server_files

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []
    ok = finished(records)

    fig, ax = plt.subplots(figsize=(7, 4))
    for method in methods:
        curves = [[h["mean_val_dice"] for h in r["report"].get("history", [])] for r in ok
                  if r["run"]["method"] == method]
        curves = [c for c in curves if c]
        if curves:
            n = min(map(len, curves))
            ax.plot(range(n), np.mean([c[:n] for c in curves], axis=0), marker="o" if n <= 30 else None,
                    label=method)
    ax.set(xlabel="round", ylabel="mean validation Dice of the received model",
           title="Validation Dice per round (mean over held-out sites and seeds)")
    if ax.lines:  # no finished run: an empty frame, without a legend
        ax.legend(fontsize=8)
    written.append(_save(fig, out / "validation_dice.png"))

    for file in server_files():  # the methods' own plots of what their runs kept (GA: the weights over rounds)
        holding = [r for r in ok if r.get(file.key)]
        if file.plot and holding:
            module, _, function = file.plot.partition(":")
            written.append(_save(getattr(importlib.import_module(module), function)(holding), out / f"{file.key}.png"))

    table = seed_dice(ok)
    fig, ax = plt.subplots(figsize=(max(6, 1.5 * len(held_out)), 4))
    width = 0.8 / max(1, len(methods))
    for i, method in enumerate(methods):
        x = np.arange(len(held_out)) + i * width
        per_site = [list(table.get((method, site), {}).values()) for site in held_out]
        means = [np.mean(v) if v else np.nan for v in per_site]
        sds = [np.std(v, ddof=1) if len(v) > 1 else 0.0 for v in per_site]
        ax.bar(x, means, width, yerr=sds, capsize=2, label=method)
        for xi, values in zip(x, per_site):
            ax.plot([xi] * len(values), values, ".", color="black", markersize=3)
    ax.set_xticks(np.arange(len(held_out)) + width * (len(methods) - 1) / 2, held_out)
    ax.set(ylabel="held-out Dice (mean over seeds, SD bars, dots: seeds)", ylim=(0, 1), title="Held-out Dice per site")
    ax.legend(fontsize=7, ncol=2)
    written.append(_save(fig, out / "held_out_dice.png"))
    return written


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------------ all of it


def _in_order(present: set[str], order: Sequence[str]) -> list[str]:
    """``present`` in the order of ``order``, then any others sorted."""
    return [x for x in order if x in present] + sorted(present - set(order))


def code_of_runs(records: Sequence[dict[str, Any]]) -> str:
    """The code fingerprints of the finished runs (:func:`feddg.report.code_fingerprint`), shortened, with counts."""
    counts = Counter(str(r.get("code", "unknown"))[:12] for r in finished(records))
    return ", ".join(f"{v} ({_plural(n, 'run')})" for v, n in sorted(counts.items()))


def mixed_code_cells(records: Sequence[dict[str, Any]]) -> str:
    """The cells (method, held-out site) whose finished seeds were made by more than one code version, each with its
    codes and their seeds, as a sentence (empty when there is none): the code change between them was admitted by a
    reproduce check, and the reader sees which cells it touches."""
    cells: dict[tuple[str, str], dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for r in finished(records):
        cells[(r["run"]["method"], r["run"]["held_out"])][str(r.get("code", "unknown"))[:12]].append(r["run"]["seed"])
    mixed = []
    for (method, site), codes in sorted(cells.items()):
        if len(codes) > 1:
            parts = [f"{code}: seed{'' if len(seeds) == 1 else 's'} {', '.join(map(str, sorted(seeds)))}"
                     for code, seeds in sorted(codes.items())]
            mixed.append(f"{method} at {site} ({'; '.join(parts)})")
    return f"Cells whose seeds were made by more than one code version: {', '.join(mixed)}." if mixed else ""


def runs_by_cpu(records: Sequence[dict[str, Any]]) -> dict[str, int]:
    """CPU model -> how many of the finished runs it made ("not recorded" for runs from before runs kept it): a run's
    results depend on its CPU model, not only on the code and the seed (:func:`feddg.report.cpu_model`), so a
    folder made on several says so."""
    return dict(sorted(Counter(run_cpu(r) or "not recorded" for r in finished(records)).items()))


def cpus_of_runs(records: Sequence[dict[str, Any]]) -> str:
    """:func:`runs_by_cpu` as a phrase: ``AMD EPYC (3 runs), not recorded (31 runs)``."""
    return ", ".join(f"{v} ({_plural(n, 'run')})" for v, n in runs_by_cpu(records).items())


def software_of_runs(records: Sequence[dict[str, Any]], dist: str = "feddg-flare") -> str:
    """Which versions of ``dist`` produced the finished runs, e.g. ``feddg-flare 0.1.0 (22 runs), 0.1.1 (28 runs)``:
    a folder that a sweep resumed across a release says so in its tables, not only in results.json."""
    counts = Counter(r["report"].get("versions", {}).get(dist, "unknown") for r in finished(records))
    return f"{dist} " + ", ".join(f"{v} ({_plural(n, 'run')})" for v, n in sorted(counts.items()))


def machine_time(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The time the folder's runs spent (finished, failed and timed out alike: machine time is spent either way;
    ``records`` as :func:`load_records` gives them, so runs recorded interrupted, which are run again, are left out),
    and how many runs each executor ran (a run's ``executor``; "unrecorded" for runs made before it was kept).

    ``wall_hours``: the time during which at least one run was running, runs made at once counted once: the union
    of each run's ``[ended_at - wall_s, ended_at]``. A run recorded before ``ended_at`` was kept counts
    ``wall_s / parallel`` (its executor's runs at once, 1 when not recorded), which is exact while the executor
    kept that many runs going. ``runs_per_hour`` = runs / ``wall_hours``, the sweep's throughput.
    ``run_hours``: the sum of the runs' wall times (N runs at once count N times), the compute the runs held; summing
    wall times as machine time overstated a 2-at-once sweep twice (1.7 "machine-hours" for 54 min).
    """
    intervals, unplaced = [], 0.0
    for r in records:
        wall = float(r.get("wall_s", 0.0))
        if isinstance(r.get("ended_at"), (int, float)):
            intervals.append((float(r["ended_at"]) - wall, float(r["ended_at"])))
        else:
            unplaced += wall / max(1, int((r.get("executor") or {}).get("parallel") or 1))
    covered, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        covered += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    wall_hours = (covered + unplaced) / 3600
    executors = Counter(str((r.get("executor") or {}).get("executor", "unrecorded")) for r in records)
    return {"wall_hours": wall_hours, "run_hours": sum(float(r.get("wall_s", 0.0)) for r in records) / 3600,
            "runs": len(records), "runs_per_hour": len(records) / wall_hours if wall_hours else 0.0,
            "runs_by_executor": dict(sorted(executors.items()))}


RETRAINING = "how far retraining alone moves one run's held-out Dice"  # what the pooled seed SD measures


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def time_spent(spent: dict[str, Any]) -> str:
    """:func:`machine_time`'s figures as a phrase: ``5.1 hours of wall time (runs at once counted once; 9.9
    run-hours), 31.1 runs per hour (run by local: 160)``."""
    executors = ", ".join(f"{name}: {n}" for name, n in spent["runs_by_executor"].items())
    return (f"{spent['wall_hours']:.1f} hours of wall time (runs at once counted once; {spent['run_hours']:.1f} "
            f"run-hours), {spent['runs_per_hour']:.1f} runs per hour" + (f" (run by {executors})" if executors else ""))


def evidence_basis(records: Sequence[dict[str, Any]], n_cells: int, spent: dict[str, Any],
                   pooled: dict[str, Any] | None) -> str:
    """The sentences that open the generated verdicts: the finished runs and the seeds per cell they rest on (of
    ``n_cells``, the table's method x held-out cells), the pooled seed SD with the cells it pools (``pooled``:
    :func:`pooled_seed_sd` of ``records``), and the machine time the folder's recorded runs took, failed ones too
    (``spent``: :func:`machine_time` of ``records``), so that a page quoting only the verdicts (the front page) says
    what they rest on, how noisy one run is and what they cost."""
    n_finished = len(finished(records))
    took = f"took {time_spent(spent)}."
    if not n_finished:
        return "No run has finished yet." + (f" The folder's {_plural(len(records), 'recorded run')} {took}"
                                              if records else "")
    per_cell = seed_dice(records)
    counts = sorted({len(per_seed) for per_seed in per_cell.values()})
    seeds = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    of_cells = f" in {len(per_cell)} of {n_cells} cells" if len(per_cell) < n_cells else ""
    noise = (f"; {RETRAINING}: a pooled seed SD of {pooled['sd']:.3f} (over {_plural(pooled['cells'], 'cell')})"
             if pooled else "")
    failed = f" ({n_finished} finished, {len(records) - n_finished} not)" if n_finished < len(records) else ""
    return (f"From {_plural(n_finished, 'finished run')}, {seeds} seed{'' if counts[-1] == 1 else 's'} per cell"
            f"{of_cells}{noise}. The folder's {_plural(len(records), 'recorded run')}{failed} {took}")


def _how_to_read(protocol: dict[str, Any]) -> str:
    synthetic = protocol.get("overrides", {}).get("data", {}).get("root") is None
    data = ("These are results on the project's synthetic data (64 px by default, sites that differ in style, "
            "content and labelling by construction): they rank methods on this data only and cannot be compared "
            "with the papers' numbers, which come from real scans at 384 px." if synthetic else
            "These are results on the data under the protocol's data.root.")
    return ("How to read: a cell is the mean over training seeds ± the seed SD (seed count). A difference is the "
            "mean of paired seed differences (seed k of a method against seed k of the baseline: the same initial "
            "weights, data order and augmentation). The seed is the unit: the average column is tested on each "
            "seed's average over the held-out sites (the runs of one seed at different sites share their start, so "
            "they are not independent), with a paired t-test over the seeds, Holm-adjusted over the methods, the "
            "exact sign-flip p-value over the same seeds beside it with its floor (2/2^K), and a 95% bootstrap "
            "interval of the crossed design (seeds drawn, and each site's test cases drawn once for all seeds). A "
            "verdict holds for these held-out sites, not for hospitals in general. "
            "\"Not resolved at N seeds\" means these seeds cannot tell the method from the baseline; it does not "
            f"mean they are equal. {data}")


def _of_design(design: Design, records: Sequence[dict[str, Any]]) -> str:
    """``; 60 of the 160 runs the folder's sweeps asked for`` (finished runs of designed cells); empty for a folder
    without a design."""
    asked = {(m, site, k) for m, sites in design.items() for site, seeds in sites.items() for k in seeds}
    if not asked:
        return ""
    done = {(r["run"]["method"], r["run"]["held_out"], r["run"]["seed"]) for r in finished(records)}
    return f"; {len(asked & done)} of the {len(asked)} runs the folder's sweeps asked for"


def write_results(out: Path, method_order: Sequence[str], site_order: Sequence[str], n_resamples: int = 9999) -> dict:
    """Write results.csv, results.md, results.json and plots/ from every run in ``out`` (a sweep that adds methods,
    sites or seeds to a folder, or resumes part of it, keeps the runs made before in the tables); rows are the
    methods run or designed (:func:`~feddg.benchmark.record.designed`) in ``method_order``, columns the held-out
    sites run or designed in ``site_order``; every baseline of :data:`BASELINES` that the folder ran gets its
    difference table; the task's full design at the papers' size is costed from the folder's
    :data:`~feddg.benchmark.cost.PAPER_ROUND_TIME` when it has one (:func:`~feddg.benchmark.cost.paper_size_cost`).
    Returns the paths."""
    from feddg.jobs import TASK_DEFAULTS
    from feddg.report import machine_info, software_versions

    out = Path(out)
    records = load_records(out)
    design = designed(out)  # the cells the folder's sweeps asked for: those not run yet show as not run
    ran = {r["run"]["method"] for r in records}
    methods = _in_order(ran | set(design), method_order)
    held_out = _in_order({r["run"]["held_out"] for r in records} | {s for sites in design.values() for s in sites},
                         site_order)
    stats = [comparisons(records, b, held_out, n_resamples) for b in BASELINES if b in ran]
    write_csv(out / "results.csv", tidy_rows(records))
    protocol = read_json(out / SWEEP_FILE)
    spent, spread = machine_time(records), seed_spread(records)
    task = protocol.get("task")
    paper_size = paper_size_cost(task, out / PAPER_ROUND_TIME) if task in TASK_DEFAULTS else None
    header = [f"# Leave-one-site-out benchmark: {task or '?'}", "",
              f"Protocol (every run): `{json.dumps(protocol.get('overrides', {}), sort_keys=True)}`; "
              f"{len(finished(records))} of {len(records)} recorded runs finished"
              f"{_of_design(design, records)} "
              f"({software_of_runs(records)}; code {code_of_runs(records)}; CPU {cpus_of_runs(records)}); "
              f"{time_spent(spent)}; scores of the "
              f"held-out site's test cases, "
              f"the reported model (final global model; MLA-BIN: the attention-combined model).", "",
              _how_to_read(protocol), ""] + ([cost_line(paper_size), ""] if paper_size else [])
    mixed = mixed_code_cells(records)
    if mixed:
        header += [mixed, ""]
    (out / "results.md").write_text("\n".join(header) + markdown(records, stats, methods, held_out, spent, spread))
    figures = plots(records, out / "plots", methods, held_out)
    serial = {c["baseline"]: {m: {"sites": {s: d.to_dict() for s, d in e["sites"].items()},
                                  "average": e["average"].to_dict() if "average" in e else None,
                                  "holm_p": e["holm_p"].to_dict() if "holm_p" in e else None,
                                  "cross_cpu": e.get("cross_cpu", {}),
                                  "verdict": verdict(m, e, c["baseline"], len(held_out), c["family"], c["data"])}
                              for m, e in c["methods"].items()} for c in stats}
    # Each run's report (per-round history, per-case scores), config and kept server files (GA's weight history)
    # stay in its runs/<id>/run.json, the sweep's one record of the run; results.json names that file and keeps only
    # what says which run it was and how it ended (second copies made it 3 MB for 28 runs, then 2 MB for 144).
    runs = [{**{k: r[k] for k in RUN_SUMMARY if k in r}, "record": f"runs/{r['run_id']}/{RUN_FILE}"} for r in records]
    # "tables_written_on": the machine that wrote this file, not the runs; "runs_by_cpu": the CPU models that made
    # the runs (each run's own in its run.json)
    write_json(out / "results.json", {"protocol": protocol, "tables_written_on": machine_info(),
                                      "runs_by_cpu": runs_by_cpu(records), "versions": software_versions(),
                                      "machine_time": spent, "paper_size": paper_size,
                                      "pooled_seed_sd": pooled_seed_sd(spread),
                                      "comparisons": serial, "runs": runs}, indent=1, finite=True)
    return {"csv": out / "results.csv", "markdown": out / "results.md", "json": out / "results.json",
            "plots": figures}


__all__ = ["BASELINES", "case_scores", "comparisons", "cpus_of_runs", "evidence_basis", "load_records",
           "machine_time", "markdown", "plots", "pooled_seed_sd", "runs_by_cpu", "seed_dice", "seed_spread",
           "software_of_runs", "tidy_rows", "time_spent", "verdict", "write_results"]
