"""The sweep's outputs from its runs' records, written into the results folder: ``results.csv`` (every score,
:mod:`~feddg.benchmark.scores`), ``results.md`` (the papers' tables, the differences to the baselines and the
verdicts, :mod:`~feddg.benchmark.tables`, under a header that says where the runs came from,
:mod:`~feddg.benchmark.provenance`), ``plots/`` (:mod:`~feddg.benchmark.plots`) and ``results.json`` with every
number.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from feddg.benchmark.cost import PAPER_ROUND_TIME, cost_line, paper_size_cost
from feddg.benchmark.plots import plots
from feddg.benchmark.provenance import (code_of_runs, cpus_of_runs, families_of_runs, machine_time, mixed_code_cells,
                                        of_design, runs_by_cpu, runs_by_family, software_of_runs, still_to_run,
                                        time_spent)
from feddg.benchmark.record import RUN_FILE, SWEEP_FILE, designed, finished, recorded_protocol
from feddg.benchmark.scores import load_records, pooled_seed_sd, seed_spread, tidy_rows, write_csv
from feddg.benchmark.tables import BASELINES, comparisons, markdown, verdict
from feddg.jsonfile import read_json, write_json


# The fields of a run record that results.json repeats (the rest is read from the run's own run.json).
RUN_SUMMARY = ("run", "run_id", "status", "reason", "wall_s", "ended_at", "log", "simulator_args", "code", "executor")


def _in_order(present: set[str], order: Sequence[str]) -> list[str]:
    """``present`` in the order of ``order``, then any others sorted."""
    return [x for x in order if x in present] + sorted(present - set(order))


def _how_to_read(protocol: dict[str, Any]) -> str:
    data_overrides = protocol.get("overrides", {}).get("data", {})
    synthetic = data_overrides.get("root") is None
    differ = ("in style alone (data.synthetic.shift: style_only)"
              if data_overrides.get("synthetic", {}).get("shift") == "style_only" else
              "in style, content and labelling")
    data = (f"These are results on the project's synthetic data (64 px by default, sites that differ {differ} by "
            "construction): they rank methods on this data only and cannot be compared with the papers' numbers, "
            "which come from real scans at 384 px." if synthetic else
            "These are results on the data under the protocol's data.root.")
    return ("How to read: a cell is the mean over training seeds ± the seed SD (seed count); the average column is "
            "the mean over the seeds run at every held-out site of each seed's site average (it names those seeds "
            "when a site has others too). A difference is the "
            "mean of paired seed differences (seed k of a method against seed k of the baseline: the same initial "
            "weights, data order and augmentation). The seed is the unit: the average column is tested on each "
            "seed's average over the held-out sites (the runs of one seed at different sites share their start, so "
            "they are not independent), with a paired t-test over the seeds, Holm-adjusted over the methods, the "
            "exact sign-flip p-value over the same seeds beside it with its floor (2/2^K), and a 95% bootstrap "
            "interval of the crossed design (seeds drawn, and each site's test cases drawn once for all seeds). A "
            "verdict holds for these held-out sites, not for hospitals in general. "
            "\"Not resolved at N seeds\" means these seeds cannot tell the method from the baseline; it does not "
            f"mean they are equal. {data}")


def folder_sites(out: Path, task: str) -> list[str]:
    """The sites of the results folder ``out`` of ``task``, in the order of its own protocol (its ``data.sites``
    over the task's; :func:`~feddg.benchmark.record.recorded_protocol`). ValueError naming the folder when it has
    no protocol or holds another task's runs."""
    from feddg.experiment import task_sites

    settings, _ = recorded_protocol(out)
    if settings is None:
        raise ValueError(f"{out} has no {SWEEP_FILE} and no runs; give a results folder of feddg benchmark")
    if settings["task"] != task:
        raise ValueError(f"{out} holds {settings['task']} runs, not --task {task}")
    return task_sites(task, settings["overrides"])


def write_results(out: Path, method_order: Sequence[str], site_order: Sequence[str], n_resamples: int = 9999) -> dict:
    """Write results.csv, results.md, results.json and plots/ from every run in ``out`` (a sweep that adds methods,
    sites or seeds to a folder, or resumes part of it, keeps the runs made before in the tables); rows are the
    methods run or designed (:func:`~feddg.benchmark.record.designed`) in ``method_order``, columns the held-out
    sites run or designed in ``site_order``; every baseline of :data:`BASELINES` that the folder ran gets its
    difference table; the task's full design at the papers' size is costed from the folder's
    :data:`~feddg.benchmark.cost.PAPER_ROUND_TIME` when it has one (:func:`~feddg.benchmark.cost.paper_size_cost`).
    Returns the paths."""
    from feddg.experiment import TASK_DEFAULTS
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
              f"{of_design(design, records)} "
              f"({software_of_runs(records)}; code {code_of_runs(records)}; CPU {cpus_of_runs(records)}; numbers "
              f"family {families_of_runs(records)}); "
              f"{time_spent(spent)}; scores of the "
              f"held-out site's test cases, "
              f"the reported model (final global model; MLA-BIN: the attention-combined model).", "",
              _how_to_read(protocol), ""] + ([cost_line(paper_size), ""] if paper_size else [])
    for line in (mixed_code_cells(records), still_to_run(design, records, methods, held_out)):
        header += [line, ""] if line else []
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
    # the runs (each run's own in its run.json); "runs_by_family": what they repeat on, with the seeds each made
    write_json(out / "results.json", {"protocol": protocol, "tables_written_on": machine_info(),
                                      "runs_by_cpu": runs_by_cpu(records), "runs_by_family": runs_by_family(records),
                                      "versions": software_versions(),
                                      "machine_time": spent, "paper_size": paper_size,
                                      "pooled_seed_sd": pooled_seed_sd(spread),
                                      "comparisons": serial, "runs": runs}, indent=1, finite=True)
    return {"csv": out / "results.csv", "markdown": out / "results.md", "json": out / "results.json",
            "plots": figures}
