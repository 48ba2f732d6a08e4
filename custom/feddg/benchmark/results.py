"""The sweep's outputs from its runs' records: a tidy CSV, the papers' tables with paired intervals against FedAvg,
plots, and one JSON with every number.

Scores are the held-out site's test split of each run's reported model (``report["reported_model"]``: the final
global model, the papers' choice, or the model a method reports instead, MLA-BIN's attention-combined one); the CSV
also has the best model. Several seeds of one method and held-out site are averaged (cells) or pooled per case
(statistics: each case's score is averaged over the seeds before the paired bootstrap, the case being the unit).
A fundus case's Dice for the statistics is the mean of its disc and cup Dice, the papers' "mean" column.
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

from feddg.benchmark.stats import Difference, holm, mean_interval, paired_difference, stratified_difference
from feddg.benchmark.sweep import RUN_FILE, SWEEP_FILE
from feddg.flare.payloads import CASES
from feddg.jsonfile import read_json, write_json

BASELINE = "fedavg"
METRICS = ("dice", "hd95", "asd")
CSV_FIELDS = ["task", "method", "held_out", "seed", "status", "model", "site", "role", "split", "structure",
              "metric", "mean", "std", "n_cases"]


def load_records(out: Path) -> list[dict[str, Any]]:
    """Every run's record in a results folder, in run-id order."""
    return [read_json(p) for p in sorted(Path(out).glob(f"runs/*/{RUN_FILE}")) if read_json(p)]


def label_names(record: dict[str, Any]) -> list[str]:
    from feddg.config import config_from_dict

    return list(config_from_dict(record["config"]).data.label_names)


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
    """(method, held-out site) -> {"values": {(structure or "mean", metric): mean over seeds}, "seeds": [...],
    "failed": [seeds]}."""
    out: dict[tuple[str, str], dict[str, Any]] = defaultdict(lambda: {"values": defaultdict(list), "seeds": [],
                                                                      "failed": []})
    for r in records:
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
    return {k: {**v, "values": {m: float(np.mean(x)) for m, x in v["values"].items()}} for k, v in out.items()}


def seed_spread(records: Sequence[dict[str, Any]]) -> dict[tuple[str, str], dict[int, float]]:
    """(method, held-out site) -> {seed: held-out Dice (mean over the structures)}, for the cells run with two
    seeds or more: what retraining alone changes, beside the case-level intervals of one trained model."""
    dice: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    for r in records:
        summary = held_out_summary(r)
        if summary is not None:
            dice[(r["run"]["method"], r["run"]["held_out"])][int(r["run"]["seed"])] = float(
                np.mean([summary[n]["dice"]["mean"] for n in label_names(r)]))
    return {k: dict(sorted(v.items())) for k, v in sorted(dice.items()) if len(v) > 1}


# ------------------------------------------------------------------------------------------------ statistics


def comparisons(records: Sequence[dict[str, Any]], baseline: str = BASELINE, n_resamples: int = 9999
                ) -> dict[str, Any]:
    """Each method against ``baseline``: the paired per-case Dice difference on every held-out site (seeds pooled)
    and over the held-out sites (stratified by site), with Holm-adjusted p-values for the average column. Sites
    without per-case scores for both (a site's policy can refuse them) are listed, not compared."""
    pooled: dict[tuple[str, str], list[np.ndarray]] = defaultdict(list)
    for r in records:
        scores = case_dice(r)
        if scores is not None:
            pooled[(r["run"]["method"], r["run"]["held_out"])].append(scores)
    mean_over_seeds = {k: np.mean(np.stack(v), axis=0) for k, v in pooled.items()
                       if len({len(x) for x in v}) == 1}
    methods = sorted({m for m, _ in mean_over_seeds} - {baseline})
    out: dict[str, Any] = {"baseline": baseline, "methods": {}}
    for method in methods:
        per_site, skipped = {}, []
        for (m, site), scores in mean_over_seeds.items():
            if m != method:
                continue
            base = mean_over_seeds.get((baseline, site))
            if base is None or len(base) != len(scores) or len(scores) < 2:
                skipped.append(site)
                continue
            per_site[site] = (scores, base)
        entry: dict[str, Any] = {"sites": {}, "without_case_scores": sorted(skipped)}
        for site, (a, b) in sorted(per_site.items()):
            entry["sites"][site] = paired_difference(a, b, n_resamples=n_resamples)
        if per_site:
            entry["average"] = stratified_difference(per_site, n_resamples=n_resamples)
        out["methods"][method] = entry
    adjusted = holm({m: e["average"].p_value for m, e in out["methods"].items() if "average" in e})
    for m, p in adjusted.items():
        out["methods"][m]["holm_p"] = p
    return out


# ------------------------------------------------------------------------------------------------ tables


def _views(records: Sequence[dict[str, Any]]) -> list[str]:
    names = next((label_names(r) for r in records if r.get("status") == "ok"), ["dice"])
    return names + (["mean"] if len(names) > 1 else [])


def _fmt(value: float | None, metric: str) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.3f}" if metric == "dice" else f"{value:.2f}"


def markdown(records: Sequence[dict[str, Any]], stats: dict[str, Any], methods: Sequence[str],
             held_out: Sequence[str]) -> str:
    """The papers' layout: rows methods, columns each held-out site and the average; one table per metric and
    structure (fundus: disc, cup, their mean), then the differences to the baseline with their intervals."""
    table = cells(records)
    unit = "mm" if any(r.get("config", {}).get("data", {}).get("layout") == "saml_nifti" for r in records) else "px"
    lines = []
    for metric in METRICS:
        for view in _views(records):
            title = {"dice": "Dice", "hd95": f"HD95 ({unit})", "asd": f"ASD ({unit})"}[metric]
            lines += [f"### {title}, {view}", "", "| method | " + " | ".join(held_out) + " | average |",
                      "|---|" + "---|" * (len(held_out) + 1)]
            for method in methods:
                row, values = [], []
                for site in held_out:
                    cell = table.get((method, site))
                    value = None if cell is None else cell["values"].get((view, metric))
                    if cell is not None and value is None and cell["failed"]:
                        row.append("failed")
                        continue
                    row.append(_fmt(value, metric) + ("" if cell is None or len(cell["seeds"]) < 2
                                                      else f" ({len(cell['seeds'])} seeds)"))
                    if value is not None:
                        values.append(value)
                average = float(np.mean(values)) if len(values) == len(held_out) else None
                lines.append(f"| {method} | " + " | ".join(row) + f" | {_fmt(average, metric)} |")
            lines.append("")
    spread = seed_spread(records)
    if spread:
        seeds = sorted({seed for per_seed in spread.values() for seed in per_seed})
        lines += ["### Seed spread: held-out Dice of each training seed (the case intervals below are for one "
                  "trained model; this is what retraining changes)", "",
                  "| method | held-out | " + " | ".join(f"seed {s}" for s in seeds) + " | max - min |",
                  "|---|---|" + "---|" * (len(seeds) + 1)]
        for (method, site), per_seed in spread.items():
            lines.append(f"| {method} | {site} | " + " | ".join(_fmt(per_seed.get(s), "dice") for s in seeds)
                         + f" | {max(per_seed.values()) - min(per_seed.values()):.3f} |")
        lines.append("")
    base = stats["baseline"]
    lines += [f"### Dice difference to {base} (paired per case, 95% bootstrap interval; * the interval excludes 0)",
              "", "| method | " + " | ".join(held_out) + " | average | Holm p (average) |",
              "|---|" + "---|" * (len(held_out) + 2)]
    for method, entry in stats["methods"].items():
        row = [entry["sites"][s].format() if s in entry["sites"] else "-" for s in held_out]
        average = entry["average"].format() if "average" in entry else "-"
        if "average" in entry and len(entry["sites"]) < len(held_out):  # say over what, never pass a part as all
            average += f" ({len(entry['sites'])} of {len(held_out)} sites)"
        holm_p = f"{entry['holm_p']:.3f}" if "holm_p" in entry else "-"
        lines.append(f"| {method} | " + " | ".join(row) + f" | {average} | {holm_p} |")
    lines.append("")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ plots


def plots(records: Sequence[dict[str, Any]], out: Path, methods: Sequence[str], held_out: Sequence[str]) -> list[Path]:
    """PNG plots: validation Dice per round per method; GA weights over rounds; held-out Dice per site with
    intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []
    ok = [r for r in records if r.get("status") == "ok"]

    fig, ax = plt.subplots(figsize=(7, 4))
    for method in methods:
        curves = [[h["mean_val_dice"] for h in r["report"].get("history", [])] for r in ok
                  if r["run"]["method"] == method]
        curves = [c for c in curves if c]
        if curves:
            n = min(map(len, curves))
            ax.plot(range(n), np.mean([c[:n] for c in curves], axis=0), marker="o", label=method)
    ax.set(xlabel="round", ylabel="mean validation Dice of the received model",
           title="Validation Dice per round (mean over held-out sites and seeds)")
    if ax.lines:  # no finished run: an empty frame, without a legend
        ax.legend(fontsize=8)
    written.append(_save(fig, out / "validation_dice.png"))

    ga_runs = [r for r in ok if r.get("ga_weights", {}).get("history")]
    if ga_runs:
        fig, axes = plt.subplots(1, len(ga_runs[:4]), figsize=(4 * len(ga_runs[:4]), 3.5), squeeze=False)
        for ax, r in zip(axes[0], ga_runs[:4]):
            history = r["ga_weights"]["history"]
            for site in history[-1]["weights"]:
                ax.plot([h["round"] for h in history], [h["weights"].get(site, np.nan) for h in history],
                        marker="o", label=site)
            ax.set(title=f"{r['run']['method']}, held out {r['run']['held_out']}", xlabel="round", ylabel="GA weight")
            ax.legend(fontsize=7)
        written.append(_save(fig, out / "ga_weights.png"))

    fig, ax = plt.subplots(figsize=(max(6, 1.5 * len(held_out)), 4))
    width = 0.8 / max(1, len(methods))
    for i, method in enumerate(methods):
        means, errors = [], [[], []]
        for site in held_out:
            pooled = [case_dice(r) for r in ok if r["run"]["method"] == method and r["run"]["held_out"] == site]
            pooled = [p for p in pooled if p is not None]
            if not pooled or len({len(p) for p in pooled}) != 1:
                means.append(np.nan)
                errors[0].append(0)
                errors[1].append(0)
                continue
            scores = np.mean(np.stack(pooled), axis=0)
            m, low, high = mean_interval(scores)
            means.append(m)
            errors[0].append(m - low)
            errors[1].append(high - m)
        ax.bar(np.arange(len(held_out)) + i * width, means, width, yerr=errors, capsize=2, label=method)
    ax.set_xticks(np.arange(len(held_out)) + width * (len(methods) - 1) / 2, held_out)
    ax.set(ylabel="held-out Dice (95% bootstrap interval)", ylim=(0, 1), title="Held-out Dice per site")
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


def software_of_runs(records: Sequence[dict[str, Any]], dist: str = "feddg-flare") -> str:
    """Which versions of ``dist`` produced the finished runs, e.g. ``feddg-flare 0.1.0 (22 runs), 0.1.1 (28 runs)``:
    a folder that a sweep resumed across a release says so in its tables, not only in results.json."""
    counts = Counter(r["report"].get("versions", {}).get(dist, "unknown") for r in records if r.get("status") == "ok")
    return f"{dist} " + ", ".join(f"{v} ({n} run{'s' if n != 1 else ''})" for v, n in sorted(counts.items()))


def write_results(out: Path, method_order: Sequence[str], site_order: Sequence[str], n_resamples: int = 9999) -> dict:
    """Write results.csv, results.md, results.json and plots/ from every run in ``out`` (a sweep that adds methods,
    sites or seeds to a folder, or resumes part of it, keeps the runs made before in the tables); rows follow
    ``method_order`` and columns ``site_order``. Returns the paths."""
    from feddg.report import machine_info, software_versions

    out = Path(out)
    records = load_records(out)
    methods = _in_order({r["run"]["method"] for r in records}, method_order)
    held_out = _in_order({r["run"]["held_out"] for r in records}, site_order)
    stats = comparisons(records, n_resamples=n_resamples)
    write_csv(out / "results.csv", tidy_rows(records))
    protocol = read_json(out / SWEEP_FILE)
    header = [f"# Leave-one-site-out benchmark: {protocol.get('task', '?')}", "",
              f"Protocol (every run): `{json.dumps(protocol.get('overrides', {}), sort_keys=True)}`; "
              f"{sum(r['status'] == 'ok' for r in records)} of {len(records)} runs finished "
              f"({software_of_runs(records)}); "
              f"scores of the held-out site's test cases, the reported model (final global model; MLA-BIN: the "
              f"attention-combined model).", ""]
    (out / "results.md").write_text("\n".join(header) + markdown(records, stats, methods, held_out))
    figures = plots(records, out / "plots", methods, held_out)
    serial = {"methods": {m: {"sites": {s: d.to_dict() for s, d in e["sites"].items()},
                              "average": e["average"].to_dict() if "average" in e else None,
                              "holm_p": e.get("holm_p"), "without_case_scores": e["without_case_scores"]}
                          for m, e in stats["methods"].items()}, "baseline": stats["baseline"]}
    # Each run's report (per-round history, per-case scores) stays in its runs/<id>/run.json, the sweep's one record
    # of the run; results.json names that file instead of holding a second copy (the copies made it 3 MB for 28 runs).
    runs = [{**{k: v for k, v in r.items() if k != "report"}, "record": f"runs/{r['run_id']}/{RUN_FILE}"}
            for r in records]
    write_json(out / "results.json", {"protocol": protocol, "machine": machine_info(),
                                      "versions": software_versions(), "comparisons": serial,
                                      "runs": runs}, indent=1)
    return {"csv": out / "results.csv", "markdown": out / "results.md", "json": out / "results.json",
            "plots": figures}


__all__ = ["Difference", "comparisons", "load_records", "markdown", "plots", "seed_spread", "software_of_runs",
           "tidy_rows", "write_results"]
