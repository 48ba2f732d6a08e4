"""Where a results folder's runs came from and what they cost: the code versions, the CPU models and the software
that made them, the cells that mix code versions, and the machine time (wall hours with runs at once counted once,
run-hours, runs per hour). The tables' header and the verdicts' opening sentence say these, so that a reader sees
what the numbers rest on.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from feddg.benchmark.record import Design, finished, run_cpu, run_family, seed_families
from feddg.benchmark.stats import seed_list


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def sites_by_seeds(per_site: dict[str, Sequence[int]]) -> str:
    """``{"BMC": [0, 1], "HK": [0, 1], "UCL": [5]}`` -> ``seeds 0-1 at BMC, HK; seed 5 at UCL``: the sites grouped
    by their seeds, in the order of ``per_site``; sites without a seed are left out."""
    groups: dict[tuple[int, ...], list[str]] = {}
    for site, seeds in per_site.items():
        if seeds:
            groups.setdefault(tuple(seeds), []).append(site)
    return "; ".join(f"{seed_list(seeds)} at {', '.join(sites)}" for seeds, sites in groups.items())


def code_of_runs(records: Sequence[dict[str, Any]]) -> str:
    """The code fingerprints of the finished runs (:func:`feddg.report.code_fingerprint`), shortened, with counts."""
    counts = Counter(str(r.get("code", "unknown"))[:12] for r in finished(records))
    return ", ".join(f"{v} ({plural(n, 'run')})" for v, n in sorted(counts.items()))


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
            parts = [f"{code}: {seed_list(sorted(seeds))}" for code, seeds in sorted(codes.items())]
            mixed.append(f"{method} at {site} ({'; '.join(parts)})")
    return f"Cells whose seeds were made by more than one code version: {', '.join(mixed)}." if mixed else ""


def runs_by_cpu(records: Sequence[dict[str, Any]]) -> dict[str, int]:
    """CPU model -> how many of the finished runs it made ("not recorded" for runs from before runs kept it): a run's
    results depend on its CPU model, not only on the code and the seed (:func:`feddg.numerics.cpu_model`), so a
    folder made on several says so."""
    return dict(sorted(Counter(run_cpu(r) or "not recorded" for r in finished(records)).items()))


def cpus_of_runs(records: Sequence[dict[str, Any]]) -> str:
    """:func:`runs_by_cpu` as a phrase: ``AMD EPYC (3 runs), not recorded (31 runs)``."""
    return ", ".join(f"{v} ({plural(n, 'run')})" for v, n in runs_by_cpu(records).items())


def runs_by_family(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Numbers family -> ``{"runs": n, "seeds": [...]}`` for the finished runs
    (:func:`~feddg.benchmark.record.run_family`: what a run repeats bit for bit on, which the CPU model alone does
    not say), with ``"made_on": {signature: n}``
    where the family holds runs of more than one CPU signature (:data:`feddg.numerics.SAME_NUMBERS`). A pair's two
    runs come from one family, so the reader sees which seeds came from which machines."""
    seeds: dict[str, list[int]] = defaultdict(list)  # family -> the seed of each of its runs
    made_on: dict[str, Counter] = defaultdict(Counter)  # family -> its runs' CPU signatures
    for r in finished(records):
        family = run_family(r)
        seeds[family].append(int(r["run"]["seed"]))
        made_on[family][(r.get("executor") or {}).get("cpu_signature") or "not recorded"] += 1
    return {f: {"runs": len(s), "seeds": sorted(set(s)),
                **({"made_on": dict(sorted(made_on[f].items()))} if len(made_on[f]) > 1 else {})}
            for f, s in sorted(seeds.items())}


def families_of_runs(records: Sequence[dict[str, Any]]) -> str:
    """:func:`runs_by_family` as a phrase: ``AMD avx2 (31 runs; seeds 0-2), Intel native-avx512 (35 runs; seeds
    3-4)``, naming the signatures of a family made on several: ``AMD avx2 [23/49 ...] (24 runs; seed 6; made on 23/49
    ... (10 runs), 25/1 ... (14 runs))``."""
    def made_on(v: dict[str, Any]) -> str:
        return "; made on " + ", ".join(f"{sig} ({plural(n, 'run')})" for sig, n in v["made_on"].items()) \
            if "made_on" in v else ""

    return ", ".join(f"{f} ({plural(v['runs'], 'run')}; {seed_list(v['seeds'])}{made_on(v)})"
                     for f, v in runs_by_family(records).items())


def software_of_runs(records: Sequence[dict[str, Any]], dist: str = "feddg-flare") -> str:
    """Which versions of ``dist`` produced the finished runs, e.g. ``feddg-flare 0.1.0 (22 runs), 0.1.1 (28 runs)``:
    a folder that a sweep resumed across a release says so in its tables, not only in results.json."""
    counts = Counter(r["report"].get("versions", {}).get(dist, "unknown") for r in finished(records))
    return f"{dist} " + ", ".join(f"{v} ({plural(n, 'run')})" for v, n in sorted(counts.items()))


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


def time_spent(spent: dict[str, Any]) -> str:
    """:func:`machine_time`'s figures as a phrase: ``5.1 hours of wall time (runs at once counted once; 9.9
    run-hours), 31.1 runs per hour (run by local: 160)``."""
    executors = ", ".join(f"{name}: {n}" for name, n in spent["runs_by_executor"].items())
    return (f"{spent['wall_hours']:.1f} hours of wall time (runs at once counted once; {spent['run_hours']:.1f} "
            f"run-hours), {spent['runs_per_hour']:.1f} runs per hour" + (f" (run by {executors})" if executors else ""))


def finished_cells(records: Sequence[dict[str, Any]]) -> set[tuple[str, str, int]]:
    """The (method, held-out site, seed) of every finished run: what :func:`of_design` counts against the design
    and :func:`still_to_run` leaves out of it."""
    return {(r["run"]["method"], r["run"]["held_out"], r["run"]["seed"]) for r in finished(records)}


def of_design(design: Design, records: Sequence[dict[str, Any]]) -> str:
    """``; 60 of the 160 runs the folder's sweeps asked for`` (finished runs of designed cells); empty for a folder
    without a design."""
    asked = {(m, site, k) for m, sites in design.items() for site, seeds in sites.items() for k in seeds}
    if not asked:
        return ""
    done = finished_cells(records)
    return f"; {len(asked & done)} of the {len(asked)} runs the folder's sweeps asked for"


def still_to_run(design: Design, records: Sequence[dict[str, Any]], methods: Sequence[str],
                 held_out: Sequence[str]) -> str:
    """The runs the folder's sweeps asked for that have not finished, by the numbers family that holds their seed
    (:func:`~feddg.benchmark.record.seed_families`: a pair's two runs must come from one family, so a seed's
    missing cells can only be made on a machine of its family; a seed no run has made yet, on any), each family's
    cells by method with the sites grouped by their seeds (``methods``, ``held_out``: the order), as a sentence;
    empty when every asked-for run has finished or the folder has no design."""
    done = finished_cells(records)
    owners = seed_families(records)
    missing: dict[str, list[tuple[str, str, int]]] = {}  # family -> its (method, site, seed) not finished
    for method in methods:
        for site in held_out:
            for seed in sorted(design.get(method, {}).get(site, [])):
                if (method, site, seed) not in done:
                    family = owners.get(seed, "any family (seeds no run has made yet)")
                    missing.setdefault(family, []).append((method, site, seed))
    if not missing:
        return ""
    parts = []
    for family, cells in sorted(missing.items(), key=lambda item: min(seed for *_, seed in item[1])):
        by_method: dict[str, dict[str, list[int]]] = {}
        for method, site, seed in cells:
            by_method.setdefault(method, {}).setdefault(site, []).append(seed)
        listed = ", ".join(f"{method} ({sites_by_seeds(sites)})" for method, sites in by_method.items())
        seeds = seed_list(sorted({seed for *_, seed in cells}))
        parts.append(f"**{family}** ({seeds}, {plural(len(cells), 'run')}): {listed}")
    return (f"Still to run, {plural(sum(map(len, missing.values())), 'run')}, each on a machine of the CPU family "
            f"that holds its seed (a pair's two runs must come from one): " + ". ".join(parts) + ".")
