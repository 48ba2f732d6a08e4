"""What GA's weights did in a result folder, run by run: how far they moved from uniform, whether the
generalization gaps that move them keep their sign from one round to the next, and the held-out Dice against the
uniform control of the same seed and held-out site.

    python benchmarks/ga_gaps.py benchmarks/results/loso_fundus_seeds [--method ga] [--control uniform]
    python benchmarks/ga_gaps.py benchmarks/results/ga_gap_fundus --controls benchmarks/results/loso_fundus_seeds

Reads each finished run's report history (``aggregation``: ``ga_weights``, ``ga_gaps`` and ``ga_step``, which
GA's aggregator writes every round, :mod:`feddg.flare.ga.aggregator`) and writes ``ga_gaps.md`` and
``ga_gaps.json`` into the folder (``--out`` elsewhere). Per run:

- departure: max_i |a_i - 1/K| of the round's weights, the mean over rounds and the last round's;
- sign persistence: the share of (site, round) pairs whose centred gap G_i - mean_j G_j has the same sign in the
  next round. GA's update (Eq. 3) moves a site's weight in the direction of that sign, so at 0.5 (coin flips) the
  weights random-walk on the gaps' noise, at 1 they follow a steady signal;
- the gaps' lag-1 correlation per site (mean over sites);
- the site with the smallest mean gap over the rounds: the one Eq. 3 takes weight from on average;
- the held-out Dice (mean over structures) minus the control's of the same seed.

Per held-out site: the means of these over seeds, the difference to the control with seeds as the unit (95%
crossed bootstrap interval and the paired t-test's p over the seeds, :func:`feddg.benchmark.stats.compare_seeds`),
which site ended with the largest weight in how many seeds (one site in every seed: a signal; a different one in
each: noise), which ended at 0.02 or less (:data:`DROPPED`) in how many, and which had the smallest mean gap in how
many. Per training site, over every run it trained in (all held-out sites together): its mean final weight and in
how many runs it ended at :data:`DROPPED` or less, had the smallest mean gap and ended with the largest weight (a
site GA drops wherever it trains is a property of that site's updates, not of one held-out split).

An ablation folder (one GA setting changed, ``--set ga.gap_split=train``) need not run the control again:
``--controls FOLDER`` takes the control's runs from another folder, each checked to be exactly the run this folder's
protocol would make of its cell (:func:`feddg.benchmark.protocol.run_mismatch`; a control whose feddg.yaml the
changed setting touches is refused, naming the setting).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from feddg.benchmark.readme import BY_SITE, BY_TRAINING_SITE  # the titles the README's ga_gaps blocks look for
from feddg.report import script_command

sys.path.insert(0, str(Path(__file__).resolve().parent))
from folder_report import number, report_folder, seed_difference, write_report  # noqa: E402


def weights_and_gaps(record: dict[str, Any]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(sites, weights [rounds x sites], gaps [rounds x sites], NaN where a site sent none) of a run's history;
    empty arrays for a run whose aggregator recorded no GA weights."""
    rounds = [h["aggregation"] for h in record.get("report", {}).get("history", [])
              if isinstance(h.get("aggregation"), dict) and h["aggregation"].get("ga_weights")]
    if not rounds:
        return [], np.zeros((0, 0)), np.zeros((0, 0))
    sites = sorted(rounds[0]["ga_weights"])
    weights = np.array([[r["ga_weights"].get(s, np.nan) for s in sites] for r in rounds], dtype=float)
    gaps = np.array([[(r.get("ga_gaps") or {}).get(s, np.nan) for s in sites] for r in rounds], dtype=float)
    return sites, weights, gaps


def sign_persistence(gaps: np.ndarray) -> float | None:
    """The share of (site, round) pairs whose centred gap keeps its sign in the next round, over the rounds where
    every site has a gap (None with fewer than two such rounds in a row)."""
    complete = gaps[~np.isnan(gaps).any(axis=1)]
    if len(complete) < 2:
        return None
    signs = np.sign(complete - complete.mean(axis=1, keepdims=True))
    return float(np.mean(signs[:-1] == signs[1:]))


def lag1_correlation(gaps: np.ndarray) -> float | None:
    """The mean over sites of the correlation of a site's gap with its gap in the next round."""
    complete = gaps[~np.isnan(gaps).any(axis=1)]
    if len(complete) < 3:
        return None
    values = [np.corrcoef(complete[:-1, i], complete[1:, i])[0, 1] for i in range(complete.shape[1])
              if complete[:-1, i].std() > 0 and complete[1:, i].std() > 0]
    return float(np.mean(values)) if values else None


def smallest_mean_gap(sites: Sequence[str], gaps: np.ndarray) -> str | None:
    """The site whose gap is the smallest on average over the rounds it sent one (a site that sent none is left
    out; None when no site sent any)."""
    sent = (~np.isnan(gaps)).sum(axis=0)
    if not sent.any():
        return None
    means = np.where(sent > 0, np.nansum(gaps, axis=0) / np.maximum(sent, 1), np.inf)
    return sites[int(np.argmin(means))]


def departure(weights: np.ndarray) -> np.ndarray:
    """max_i |a_i - 1/K| of each round's weights."""
    return np.abs(weights - 1.0 / weights.shape[1]).max(axis=1)


def controls_from(folder: Path, controls: Path, control: str, method: str) -> list[dict[str, Any]]:
    """The finished ``control`` runs of the results folder ``controls`` as controls of ``folder``'s ``method``
    runs. ValueError, naming the folder or run and why, unless ``controls`` holds at least one, each is exactly the
    run ``folder``'s protocol makes of its cell in the sections the control's jobs have (a setting of another
    method's section, ``ga.*`` for uniform, is inert there and left aside on both sides), and ``controls`` admits
    the code of every ``method`` run of ``folder`` (it made runs there, or a reproduce check admitted it)."""
    from feddg.benchmark.protocol import Protocol, run_mismatch
    from feddg.benchmark.record import recorded_protocol, run_records
    from feddg.benchmark.reproduce import admitted_codes
    from feddg.jobs import experiment

    settings, _ = recorded_protocol(folder)
    if settings is None or not (controls / "sweep.json").is_file():
        raise ValueError(f"{folder if settings is None else controls}: not a benchmark results folder with a protocol")
    sections = experiment(settings["task"], control, validate=False)
    protocol = Protocol(settings["task"], {k: v for k, v in settings["overrides"].items() if k in sections},
                        settings["simulator_args"])
    theirs = run_records(controls)
    found = []
    for name, record in theirs.items():
        if (record.get("run") or {}).get("method") != control or record.get("status") != "ok":
            continue
        config = {k: v for k, v in (record.get("config") or {}).items() if k in sections}
        why = run_mismatch(protocol, name, {**record, "config": config})
        if why:
            raise ValueError(f"{controls / 'runs' / name} is not a run of {folder}'s protocol: {why}")
        found.append(record)
    if not found:
        raise ValueError(f"{controls}: no finished {control} run")
    admitted = admitted_codes(controls, theirs)
    for name, record in run_records(folder).items():
        code = str(record.get("code", "unknown"))
        if (record.get("run") or {}).get("method") == method and record.get("status") == "ok" and code not in admitted:
            raise ValueError(f"{folder / 'runs' / name} was made by code {code[:12]}, which {controls} does not "
                             f"admit: its controls may differ from what this code makes of them (run a sweep there "
                             f"with --reproduce-check)")
    return found


# A final weight at or below this, as the per-run table prints it (two decimals): that site's updates barely reach
# the global model (a tenth or less of the uniform weight 1/K = 0.2 at five training sites).
DROPPED = 0.02


def diagnose(records: Sequence[dict[str, Any]], method: str, control: str) -> list[dict[str, Any]]:
    """One row per finished run of ``method`` (held-out site, seed order); ``records`` also hold the control's."""
    from feddg.benchmark.scores import seed_dice

    dice = seed_dice(records)
    rows = []
    for record in sorted(records, key=lambda r: (r["run"]["held_out"], int(r["run"]["seed"]))):
        if record["run"]["method"] != method or record.get("status") != "ok":
            continue
        sites, weights, gaps = weights_and_gaps(record)
        if not sites:
            continue
        site, seed = record["run"]["held_out"], int(record["run"]["seed"])
        mine, theirs = dice.get((method, site), {}).get(seed), dice.get((control, site), {}).get(seed)
        moved = departure(weights)
        rows.append({"held_out": site, "seed": seed, "rounds": len(weights),
                     "final_weights": {s: round(float(w), 4) for s, w in zip(sites, weights[-1]) if np.isfinite(w)},
                     "mean_departure": float(moved.mean()), "final_departure": float(moved[-1]),
                     "sign_persistence": sign_persistence(gaps), "lag1_correlation": lag1_correlation(gaps),
                     "smallest_mean_gap": smallest_mean_gap(sites, gaps),
                     "dice_minus_control": None if mine is None or theirs is None else mine - theirs})
    return rows


def summarise(rows: Sequence[dict[str, Any]], records: Sequence[dict[str, Any]], method: str,
              control: str) -> list[dict[str, Any]]:
    """Per held-out site: seeds, the mean of each diagnostic, the paired difference to ``control`` with seeds as the
    unit (None without a paired seed), how often each site ended with the most weight, and how often with
    :data:`DROPPED` or less."""
    from feddg.benchmark.scores import case_scores
    from feddg.benchmark.stats import compare_seeds

    scores = case_scores(records)
    out = []
    for site in sorted({r["held_out"] for r in rows}):
        mine = [r for r in rows if r["held_out"] == site]

        def mean(key: str) -> float | None:
            values = [r[key] for r in mine if r[key] is not None]
            return float(np.mean(values)) if values else None

        heaviest = Counter(max(r["final_weights"], key=r["final_weights"].get) for r in mine)
        ours, theirs = scores.get((method, site), {}), scores.get((control, site), {})
        paired = {k: (ours[k], theirs[k]) for k in sorted(set(ours) & set(theirs))}
        difference = compare_seeds({site: paired}) if paired else None
        out.append({"held_out": site, "seeds": len(mine), "mean_departure": mean("mean_departure"),
                    "sign_persistence": mean("sign_persistence"), "lag1_correlation": mean("lag1_correlation"),
                    "difference": None if difference is None else difference.to_dict(),
                    "heaviest": dict(heaviest.most_common()),
                    "dropped": dict(Counter(name for r in mine for name, w in r["final_weights"].items()
                                            if round(w, 2) <= DROPPED).most_common()),
                    "smallest_gap": dict(Counter(r["smallest_mean_gap"] for r in mine
                                                 if r["smallest_mean_gap"]).most_common())})
    return out


def by_training_site(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per training site (name order), over the runs of ``rows`` it trained in, whatever their held-out site: how
    many runs, its mean final weight, and in how many runs it ended at :data:`DROPPED` or less (as the per-run table
    prints it), had the smallest mean gap, and ended with the largest weight."""
    out = []
    for site in sorted({name for r in rows for name in r["final_weights"]}):
        mine = [r for r in rows if site in r["final_weights"]]
        out.append({"site": site, "runs": len(mine),
                    "mean_final_weight": float(np.mean([r["final_weights"][site] for r in mine])),
                    "dropped": sum(round(r["final_weights"][site], 2) <= DROPPED for r in mine),
                    "smallest_gap": sum(r["smallest_mean_gap"] == site for r in mine),
                    "heaviest": sum(max(r["final_weights"], key=r["final_weights"].get) == site for r in mine)})
    return out


def markdown(rows: Sequence[dict[str, Any]], summary: Sequence[dict[str, Any]], training: Sequence[dict[str, Any]],
             command: str, method: str, control: str) -> str:
    """``ga_gaps.md``: the per held-out site ``summary`` (:func:`summarise`), the per ``training`` site table
    (:func:`by_training_site`) and the per-run ``rows`` (:func:`diagnose`)."""
    lines = [f"# What {method}'s weights did", "", f"`{command}` (generated from the folder's run.json files).", "",
             "Departure: max_i |a_i - 1/K| (mean over rounds, last round). Sign persistence: the share of (site, "
             "round) pairs whose centred gap keeps its sign in the next round (0.5: coin flips; GA then moves the "
             "weights on noise). Smallest mean gap: the site whose gap is the smallest on average over the rounds "
             "(Eq. 3 takes weight from it on average). "
             f"Dice - {control}: held-out Dice minus the {control} run of the same seed (per "
             "site: the mean over seeds, the 95% crossed bootstrap interval and the paired t-test's p-value over "
             "the seeds, the seed as the unit; not adjusted over the sites). "
             f"Ended at <= {DROPPED}: the sites whose final weight was {DROPPED} or less, in how many seeds.", "",
             f"{BY_SITE} (means over seeds)", "",
             f"| held-out | seeds | mean departure | sign persistence | gap lag-1 corr. | Dice - {control} | "
             f"largest final weight (seeds) | ended at <= {DROPPED} (seeds) | smallest mean gap (seeds) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        heaviest = ", ".join(f"{site} {n}" for site, n in s["heaviest"].items())
        dropped = ", ".join(f"{site} {n}" for site, n in s["dropped"].items()) or "-"
        smallest = ", ".join(f"{site} {n}" for site, n in s["smallest_gap"].items()) or "-"
        lines.append(f"| {s['held_out']} | {s['seeds']} | {number(s['mean_departure'])} | "
                     f"{number(s['sign_persistence'])} | {number(s['lag1_correlation'])} | "
                     f"{seed_difference(s['difference'])} | {heaviest} | {dropped} | {smallest} |")
    lines += ["", f"{BY_TRAINING_SITE} (every run it trained in)", "",
              f"Over the held-out sites together: the runs a site trained in, its mean final weight, and in how many "
              f"of those runs it ended at {DROPPED} or less, had the smallest mean gap, ended with the largest weight.",
              "", f"| training site | runs | mean final weight | ended at <= {DROPPED} | smallest mean gap | "
              f"largest final weight |", "|---|---|---|---|---|---|"]
    for t in training:
        lines.append(f"| {t['site']} | {t['runs']} | {t['mean_final_weight']:.2f} | {t['dropped']} | "
                     f"{t['smallest_gap']} | {t['heaviest']} |")
    lines += ["", "## Per run", "",
              f"| held-out | seed | rounds | final weights | mean departure | last departure | sign persistence | "
              f"gap lag-1 corr. | smallest mean gap | Dice - {control} |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        weights = ", ".join(f"{site} {w:.2f}" for site, w in r["final_weights"].items())
        lines.append(f"| {r['held_out']} | {r['seed']} | {r['rounds']} | {weights} | {number(r['mean_departure'])} | "
                     f"{number(r['final_departure'])} | {number(r['sign_persistence'])} | "
                     f"{number(r['lag1_correlation'])} | {r['smallest_mean_gap'] or '-'} | "
                     f"{number(r['dice_minus_control'], True)} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="a feddg benchmark results folder")
    parser.add_argument("--method", default="ga", help="a method whose aggregator records GA weights (default: ga)")
    parser.add_argument("--control", default="uniform", help="the method of the Dice difference (default: uniform)")
    parser.add_argument("--controls", type=Path, help="a results folder to take the control's runs from (default: "
                                                      "the folder itself), each checked against the folder's protocol")
    parser.add_argument("--out", type=Path, help="where to write ga_gaps.md/.json (default: the folder)")
    args = parser.parse_args(argv)
    from feddg.benchmark.scores import load_records

    try:
        out = report_folder(args.folder, args.out)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    records = load_records(args.folder)
    if args.controls:
        try:
            controls = controls_from(args.folder, args.controls, args.control, args.method)
        except ValueError as e:
            print(e, file=sys.stderr)
            return 2
        records = [r for r in records if r["run"]["method"] != args.control] + controls
    rows = diagnose(records, args.method, args.control)
    if not rows:
        print(f"{args.folder}: no finished {args.method} run with GA weights in its history", file=sys.stderr)
        return 1
    summary, training = summarise(rows, records, args.method, args.control), by_training_site(rows)
    command = script_command("benchmarks/ga_gaps.py", argv)
    try:
        write_report(out, "ga_gaps", markdown(rows, summary, training, command, args.method, args.control),
                     {"command": command, "summary": summary, "by_training_site": training, "runs": rows})
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
