"""The papers' tables of a results folder and what the evidence supports: each method against each baseline with
the seed as the unit, the markdown tables, and the generated verdict sentences (the benchmark page and the README
quote them; no interpretation is typed).

A table cell is the mean over the cell's training seeds with their SD and count. The comparisons treat the seed as
the unit (:mod:`feddg.benchmark.stats`): seed k of a method is paired with seed k of the baseline, never averaged
with other seeds before a comparison.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from feddg.benchmark.provenance import machine_time, plural, sites_by_seeds, time_spent
from feddg.benchmark.record import finished, run_family
from feddg.benchmark.scores import METRICS, case_scores, cells, label_names, pooled_seed_sd, seed_dice, seed_spread
from feddg.benchmark.stats import (ALPHA, DIFFERENCE_THAT_MATTERS, MIN_SEEDS, SeedDifference, common_seeds,
                                   compare_seeds, holm, seed_list)
from feddg.layouts import LAYOUTS


BASELINE = "fedavg"


# The baselines every method is compared with, where the folder ran them: FedAvg, and its equal-weight control
# (the GA paper's step-0 control; gradient alignment also averages its corrected updates with equal weights).
BASELINES = (BASELINE, "uniform")


RETRAINING = "how far retraining alone moves one run's held-out Dice"  # what the pooled seed SD measures


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
    # A method has an average when it is paired at every held-out site and some seed was run at all of them (a
    # folder made a part at a time can hold every site with no seed in common: then each site's column only).
    averaged = {m for m, p in paired_by_method.items() if len(p) == len(sites) and common_seeds(p.values())}
    # The averages are one family, Holm-adjusted over all of them (one with too few seeds for a test counts as not
    # rejected): their power is stated at the level of Holm's strictest step, alpha / m, so that "resolvable" means
    # resolvable after the correction the p-value beside it had.
    family = len(averaged)
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
        if method in averaged:
            entry["average"] = compare_seeds(paired, n_resamples=n_resamples, alpha=ALPHA / family)
        out["methods"][method] = entry
    out["family"] = family
    adjusted = holm({m: e["average"].p for m, e in out["methods"].items() if "average" in e
                     and e["average"].p is not None}, family=family)
    for m, p in adjusted.items():
        out["methods"][m]["holm_p"] = p
    return out


def verdict(method: str, entry: dict[str, Any], baseline: str, n_sites: int, family: int = 1,
            data: str = "synthetic") -> str:
    """One sentence on what the evidence supports for ``method`` against ``baseline`` on the average column, or,
    for a method without one (not yet compared at every held-out site, or with no seed run at all of them), each
    site's difference so far (its p-value not Holm-adjusted); generated from the comparison (the benchmark page
    docs/benchmark.md quotes these; no interpretation is typed). It names the test (the paired t-test over the
    seeds, the seed as the unit: :mod:`feddg.benchmark.stats`), the seeds, how many sites the method is ahead at,
    and what the verdict is conditional on: these held-out sites, of ``data`` ("synthetic" or "real")."""
    if "average" not in entry:  # a folder made a part at a time: what each site run so far shows, unadjusted
        sites = "; ".join(f"{site} {d.format()}" + (f", paired t p {d.p.format()} (not Holm-adjusted)"
                                                    if d.p is not None else "")
                          for site, d in entry["sites"].items())
        where = (f"compared at every one of the {n_sites} held-out sites, but no seed was run at all of them, so"
                 if len(entry["sites"]) == n_sites else
                 f"compared at {len(entry['sites'])} of {n_sites} held-out sites only,")
        return f"**{method}** vs {baseline}: {where} no average: {sites}."
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


def site_average(table: dict[tuple[str, str], dict[str, Any]], method: str, held_out: Sequence[str],
                 key: tuple[str, str]) -> tuple[float | None, list[int]]:
    """The table's average column for ``method``: each seed's mean over the ``held_out`` sites, averaged over the
    seeds run at every one of them (the seeds its test uses, :func:`feddg.benchmark.stats.compare_seeds`), and
    those seeds. ``table``: :func:`feddg.benchmark.scores.cells`; ``key``: (structure or "mean", metric).

    A folder made a part at a time can hold five seeds at one site and two at another: the mean of the cells'
    means would then mix seeds that a method ran at one site only, so the column keeps to the common seeds.
    ``(None, [])`` when a site has no finished run or no seed was run at every site."""
    per_site = []
    for site in held_out:
        cell = table.get((method, site))
        values = [] if cell is None else cell["values"].get(key, [])
        if not values:
            return None, []
        per_site.append(dict(zip(cell["seeds"], values)))
    common = common_seeds(per_site)
    if not common:
        return None, []
    return float(np.mean([np.mean([v[k] for v in per_site]) for k in common])), common


def _average(table: dict[tuple[str, str], dict[str, Any]], method: str, held_out: Sequence[str],
             key: tuple[str, str]) -> str:
    """:func:`site_average` as a table cell, naming its seeds when some site has others too: ``0.612 (seeds 3-4)``;
    ``-`` when there is none."""
    value, seeds = site_average(table, method, held_out, key)
    if value is None:
        return "-"
    if all(len(table[(method, site)]["values"][key]) == len(seeds) for site in held_out):
        return _fmt(value, key[1])
    return f"{_fmt(value, key[1])} ({seed_list(seeds)})"


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
                row = []
                for site in held_out:
                    cell = table.get((method, site))
                    values = [] if cell is None else cell["values"].get((view, metric), [])
                    row.append(_cell(values, metric) if values else
                               "failed" if cell is not None and cell["failed"] else "not run")
                lines.append(f"| {method} | " + " | ".join(row) +
                             f" | {_average(table, method, held_out, (view, metric))} |")
            lines.append("")
    if pooled:
        seeds = sorted({seed for per_seed in spread.values() for seed in per_seed})
        lines += ["### Seed values: held-out Dice of each training seed", "",
                  f"Pooled seed SD {pooled['sd']:.3f} (over {plural(pooled['cells'], 'cell')}, "
                  f"{plural(pooled['runs'], 'run')}: the root of the mean of the cells' variances over seeds): "
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
        crossed = [f"{method} at {site}, {seed_list(sorted(p['seed'] for p in pairs))} "
                   f"({pairs[0][method]} against {pairs[0][base]})"
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
        coverage = seed_coverage(seed_dice(records), methods, held_out)
        lines += [coverage, ""] if coverage else []
        for comparison in stats:
            for method, entry in comparison["methods"].items():
                line = verdict(method, entry, comparison["baseline"], len(held_out), comparison["family"],
                               comparison["data"])
                lines.append(f"- {line}")
        lines += unfinished
        lines.append("")
    return "\n".join(lines)


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
        return "No run has finished yet." + (f" The folder's {plural(len(records), 'recorded run')} {took}"
                                              if records else "")
    per_cell = seed_dice(records)
    counts = sorted({len(per_seed) for per_seed in per_cell.values()})
    seeds = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    of_cells = f" in {len(per_cell)} of {n_cells} cells" if len(per_cell) < n_cells else ""
    noise = (f"; {RETRAINING}: a pooled seed SD of {pooled['sd']:.3f} (over {plural(pooled['cells'], 'cell')})"
             if pooled else "")
    failed = f" ({n_finished} finished, {len(records) - n_finished} not)" if n_finished < len(records) else ""
    return (f"From {plural(n_finished, 'finished run')}, {seeds} seed{'' if counts[-1] == 1 else 's'} per cell"
            f"{of_cells}{noise}. The folder's {plural(len(records), 'recorded run')}{failed} {took}")


def seed_coverage(per_cell: dict[tuple[str, str], dict[int, float]], methods: Sequence[str],
                  held_out: Sequence[str]) -> str:
    """Which seeds have finished where: for each of ``methods`` with a finished run, its held-out sites grouped by
    the seeds finished there (``per_cell``: :func:`~feddg.benchmark.scores.seed_dice`), e.g. "**fedavg** seeds
    0-5 at BIDMC, BMC; seeds 3-5 at RUNMC, UCL" (one sentence when every method has the same seeds at every site),
    so that a page quoting only the verdicts says where a folder made a part at a time stands without a typed
    summary; empty when nothing has finished."""
    seeds = {(m, s): sorted(per_cell.get((m, s), {})) for m in methods for s in held_out}
    every = {tuple(v) for v in seeds.values()}
    if len(every) == 1 and () not in every:
        return f"Finished: {seed_list(next(iter(every)))}, for every method at every held-out site."
    parts = []
    for method in methods:
        per_site = {site: seeds[method, site] for site in held_out}
        if any(per_site.values()):  # else nothing finished: the "not run yet" line says so
            not_run = [site for site, s in per_site.items() if not s]
            parts.append(f"**{method}** {sites_by_seeds(per_site)}"
                         + (f"; none at {', '.join(not_run)}" if not_run else ""))
    return ("Seeds finished, by method (held-out sites with the same seeds together): " + ". ".join(parts) + "."
            if parts else "")
