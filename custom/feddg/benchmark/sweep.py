"""The leave-one-site-out sweep: methods x held-out sites x seeds, each a real NVFlare simulator job.

Every run is the task's job of the template (:mod:`feddg.jobs`) with the sweep's protocol (``--set`` overrides,
the data root and layout) and the run's own settings (``data.unseen_site``, the seeds) merged in, validated by the
experiment schema (:mod:`feddg.benchmark.protocol`), written to ``OUT/runs/<run id>/`` and run, its time
bounded, by an executor (:mod:`feddg.benchmark.executors`): ``feddg simulate`` on this host, ``--parallel N`` at
once (the default), Ray tasks on a cluster, or jobs of an NVFlare deployment. A run's outcome is
``OUT/runs/<run id>/run.json``, written here from what the executor gave back, the same fields whichever ran it
(``executor`` says which, and where): ``ok`` with the report, or ``failed`` / ``timeout`` with the reason and the
log's path (a failed run is shown as failed, never as a number). The sweep resumes: a run with a ``run.json`` is not run
again (``retry_failed`` retries failed ones; an interrupted one is always run again).

A folder holds one protocol, and its record is checked, not trusted (:mod:`feddg.benchmark.record`): ``OUT/sweep.json``
records the task and every setting that changes the numbers; a sweep with other settings is refused, naming the
first setting that differs with both values, and so is a folder holding a run whose own config is not the
protocol's for its cell. Methods, held-out sites and seeds may be added to a folder later. One sweep works on a
folder at a time (``OUT/.sweep.lock``). With a data root the data are checked once, as ``feddg check-data`` does,
before any run.

A folder holds one code version: every run records the fingerprint of the code that ran it
(:func:`feddg.report.code_fingerprint`), and a sweep whose code differs from the folder's runs is refused, unless
``reproduce_check`` first re-runs one finished cell of every method the folder holds (seed 0 where it can, on its
quickest held-out site: :func:`reproduce_cells`) with the new code and every per-case score of each comes out
identical (the evidence, each method's cell, CPU model and result, goes to ``sweep.json`` and ``results.json``): a
change that touches one method's code path is caught by that method's cell. A run repeats only on its CPU family
(maker and kernels: :func:`feddg.numerics.numbers_family`), so the check re-runs cells of this machine's family.

Each seed's runs come from one CPU family (a pair's two runs must): a run of another family than its seed's is
refused like a run of another protocol (``move_aside`` moves it to ``OUT/aside/``), and a sweep on this host leaves
the cells of seeds held by another family for a machine of that family, naming them. Different seeds may come
from different families: each seed is an independent draw, and the tests take the seed as their unit.

SIGINT (Ctrl-C) and SIGTERM stop the runs in progress with every process they started (the simulator starts its
site workers in sessions of their own: :mod:`feddg.process_tree`), record each as ``interrupted`` and end the sweep
with :class:`Interrupted`; a run that finished before the signal keeps its record, and a run never started leaves
no folder. A ``run.json`` is written whole or not at all (an executor never writes one).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from feddg.benchmark.executors.base import Cell, CellExecutor, Outcome
from feddg.benchmark.executors.local import LocalExecutor
from feddg.benchmark.protocol import (Protocol, Run, first_difference, owned_settings, run_experiment, run_mismatch,
                                      run_overrides, seed_overrides)
from feddg.benchmark.record import (ASIDE_DIR, INTERRUPTED, RUN_FILE, SWEEP_FILE, check_records, finished,
                                    folder_lock, prepare_folder, record_design, run_cpu, run_family, run_records,
                                    seed_families)
from feddg.benchmark.signals import STOP_SIGNALS, Interrupted, handle_stop_signals
from feddg.config import ConfigError
from feddg.folders import claim
from feddg.numerics import cpu_flags, numbers_family
from feddg.jsonfile import read_json, write_json
from feddg.report import REPORT_FILE

REPRODUCE_DIR = "reproduce"  # where the reproduce check re-runs a cell (removed afterwards)


def kept_files() -> tuple[str, ...]:
    """The server files a finished run keeps (the workspace, with its models, is removed): the report, the
    timings and the progress every job writes, and the files the registered methods ask the benchmark to keep."""
    from feddg.flare.constants import PROGRESS_FILE
    from feddg.flare.registry import server_files
    from feddg.flare.timings import TIMINGS_FILE

    return (REPORT_FILE, TIMINGS_FILE, PROGRESS_FILE, *(f.name for f in server_files() if f.keep))

__all__ = ["Interrupted", "Protocol", "Run", "RUN_FILE", "SWEEP_FILE", "default_overrides", "execute",
           "handle_stop_signals", "parse_seeds", "plan", "prepare_folder", "run_experiment", "run_overrides",
           "seed_overrides", "sweep"]


# The sweep's protocol per task, chosen by the rounds pilot (benchmarks/pilot_rounds.py; its curves, command and
# cost are in benchmarks/results/pilot_rounds/<task>/): many rounds of one local epoch, the papers' shape, where
# every method acts each round; the number of rounds is where FedAvg's last fifth of rounds gains less than 0.01
# validation Dice. The jobs keep their quick defaults. tests/test_benchmark_pilot.py checks these numbers against
# the committed pilot.json.
SWEEP_ROUNDS = {"prostate": 298, "fundus": 153}
PILOT_SECONDS_PER_ROUND = {"prostate": 1.75, "fundus": 0.90}
# On the synthetic data, the held-out site gets more test cases than a training site (it costs evaluation only and
# narrows each seed's case error); with real data the site has the cases it has.
SYNTHETIC_HELD_OUT_CASES = {"prostate": 24, "fundus": 72}
# The CPU numerics a sweep runs with unless told otherwise (feddg.numerics): the machine's own kernels, since no pin
# makes a run repeat across CPU makers (feddg.numerics.numbers_family); each seed's runs stay within one family.
SWEEP_CPU_PIN = "off"
# The held-out site of the benchmark's timing runs (benchmarks/round_time.py --protocol, sweep_throughput.py).
TIMING_HELD_OUT = {"prostate": "BIDMC", "fundus": "Domain1"}


def default_overrides(task: str, synthetic: bool) -> dict[str, Any]:
    """The sweep's protocol for ``task`` before the user's ``--set``: :data:`SWEEP_ROUNDS` rounds of one local
    epoch and, on synthetic data, :data:`SYNTHETIC_HELD_OUT_CASES` test cases at the held-out site."""
    out: dict[str, Any] = {"train": {"rounds": SWEEP_ROUNDS[task], "local_epochs": 1}}
    if synthetic:
        out["data"] = {"synthetic": {"held_out_cases": SYNTHETIC_HELD_OUT_CASES[task]}}
    return out


def timing_cell(task: str) -> tuple[Protocol, Run]:
    """The protocol and the run the benchmark times for ``task``: FedAvg, seed 0, held out at
    :data:`TIMING_HELD_OUT`, under the sweep's protocol on synthetic data (:func:`default_overrides`)."""
    return Protocol(task, default_overrides(task, synthetic=True)), Run(task, "fedavg", TIMING_HELD_OUT[task], 0)


def parse_seeds(text: str, flag: str = "--seeds") -> list[int]:
    """``"0,1,2"``, ``"0-4"`` or a mix (``"0-2,7"``) -> the seeds in the order given; ValueError naming ``flag``
    for an empty list, a non-integer, a negative seed, a backwards range or a repeated seed."""
    if not text.strip():
        raise ValueError(f"{flag} is empty: give seeds as 0,1,2 or 0-4")
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if part.startswith("-"):
            raise ValueError(f"{flag} {text!r}: {part!r}: seeds are non-negative integers")
        low, sep, high = part.partition("-")
        try:
            span = range(int(low), int(high) + 1) if sep else [int(part)]
        except ValueError:
            raise ValueError(f"{flag} {text!r}: {part!r} is not a seed (give 0,1,2 or 0-4)") from None
        if sep and int(high) < int(low):
            raise ValueError(f"{flag} {text!r}: the range {part!r} runs backwards")
        seeds.extend(span)
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ValueError(f"{flag} {text!r}: seed(s) {repeated} given twice")
    return seeds


def plan(protocol: Protocol, methods: Sequence[str], held_out: Sequence[str], seeds: Sequence[int]) -> list[Run]:
    """The runs, held-out sites outermost (an interrupted sweep leaves whole columns of the table); each validated
    before anything runs (an unknown method, site or key fails here, naming it, and so do a setting the sweep sets
    itself, e.g. ``train.seed``, and a protocol under which a method would not act, e.g. GA with one round)."""
    from feddg.flare.registry import experiment_from_dict
    from feddg.flare.registry import method

    owned = owned_settings(protocol.overrides)
    if owned:
        raise ConfigError("; ".join(owned))
    runs = [Run(protocol.task, m, h, s) for h in held_out for m in methods for s in seeds]
    for run in runs:
        reason = method(run.method).inactive_reason(experiment_from_dict(run_experiment(protocol, run)))
        if reason:
            raise ConfigError(f"{run.method} would not act under this protocol ({run.run_id}): {reason}")
    return runs


def check_real_data(protocol: Protocol, run: Run, report: Callable[[str], None] = print) -> None:
    """With a data root in the protocol, the checks of ``feddg check-data`` (:func:`feddg.data.check.check_data`)
    on the sites the runs use, once, before any run: ConfigError with the problems found, if any. The warnings are
    reported, and so is the size the runs train at when the data's images are larger."""
    from feddg.data.check import check_data, describe_shapes

    data = run_experiment(protocol, run)["data"]
    if not data.get("root"):
        return
    root, layout, size = data["root"], data["layout"], data["image_size"]
    found = check_data(layout, Path(root), list(data["sites"]), data["task"])
    problems = found["problems"]
    if problems:
        more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
        raise ConfigError(f"data.root {root}: the data check (feddg check-data --layout {layout} --root {root}) "
                          f"found {len(problems)} problem(s), so no run was started: {'; '.join(problems[:3])}{more}")
    for warning in found["warnings"]:
        report(f"data warning: {warning}")
    shapes = sorted({tuple(s) for site in found["sites"].values() for s in site["image_shapes"]})
    side = max((max(s[:2]) for s in shapes), default=0)
    if side > size:
        report(f"the data's images are up to {side} px a side ({describe_shapes(shapes)}); the runs train at "
               f"data.image_size = {size} px, every image resized to {size}x{size} (--set data.image_size=N to "
               f"change it)")


def prepare_cell(run: Run, protocol: Protocol, out: Path, timeout: float, cpu_pin: str = SWEEP_CPU_PIN) -> Cell:
    """The cell of ``run``, ready for an executor: a fresh ``out/runs/<id>`` (what an unfinished run left there is
    cleared) holding the run's job, written from the template with the protocol and the run's own settings, run
    with the CPU numerics ``cpu_pin`` (:mod:`feddg.numerics`)."""
    from feddg.recipes.export import write_job

    folder = out / "runs" / run.run_id
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    job = write_job(folder, f"{run.task}_{run.method}", run_overrides(protocol, run))
    rounds = run_experiment(protocol, run)["train"]["rounds"]
    return Cell(run, job, folder, timeout, rounds, tuple(protocol.simulator_args), cpu_pin)


def execute(run: Run, protocol: Protocol, out: Path, timeout: float, report: Callable[[str], None] = print,
            executor: CellExecutor | None = None) -> dict[str, Any]:
    """Run one cell (with ``executor``, by default one local simulator run) and record its outcome in
    ``out/runs/<id>/run.json``; :class:`Interrupted` after recording it when a stop signal came."""
    executor = executor or LocalExecutor()
    cell = prepare_cell(run, protocol, out, timeout)
    executor.check([cell])
    records = {}
    _run_cells(protocol, [cell], executor, report, lambda c, record: records.update({c.run_id: record}))
    return records[run.run_id]


def _run_cells(protocol: Protocol, cells: Sequence[Cell], executor: CellExecutor, report: Callable[[str], None],
               recorded: Callable[[Cell, dict[str, Any]], None]) -> None:
    """Run ``cells`` with ``executor``, writing each one's ``run.json`` as it ends and then calling ``recorded``
    (signals wait for its end); :class:`Interrupted`, naming the runs it stopped, after every record is written
    when a stop signal came."""
    stopped: list[str] = []

    def on_done(cell: Cell, outcome: Outcome) -> None:
        record = _outcome(cell.run, protocol, run_experiment(protocol, cell.run), cell.folder, outcome,
                          cell.cpu_pin if executor.applies_cpu_pin else "off")
        write_json(cell.folder / RUN_FILE, record, indent=2, finite=True)  # atomic: a run.json is whole or absent
        if record["status"] == INTERRUPTED:
            stopped.append(cell.run_id)
        recorded(cell, record)

    with STOP_SIGNALS.deferred():  # from the first start to the last record: a signal stops the runs, then ends
        executor.run_cells(cells, on_done, report)
        STOP_SIGNALS.raise_received(stopped)


def _outcome(run: Run, protocol: Protocol, exp: dict[str, Any], folder: Path, outcome: Outcome,
             cpu_pin: str = "off") -> dict[str, Any]:
    """The run's record: its cell, status, wall time, when it was recorded (``ended_at``, UTC epoch seconds: with the
    wall time it places the run in time, so runs made at once count once in the machine time), log, config,
    simulator flags, code and where it ran (``executor``: the executor's ``Outcome.where``); a run that ended by
    itself is ``ok`` only with exit code 0 (when it has one) and a report, which the record then holds with the
    files the tables need (the executor's scratch, e.g. the simulator workspace with its models, is removed; so is
    an interrupted run's)."""
    from feddg.report import code_fingerprint

    status, reason, returncode = outcome.status, outcome.reason, outcome.returncode
    record: dict[str, Any] = {"run": run.__dict__, "run_id": run.run_id, "status": status,
                              "wall_s": round(outcome.wall_s, 1), "ended_at": round(time.time(), 1),
                              "log": str(outcome.log), "config": exp,
                              "simulator_args": list(protocol.simulator_args), "code": code_fingerprint(),
                              "cpu_pin": cpu_pin, "executor": outcome.where}
    server = outcome.server_dir
    report_json = read_json(server / REPORT_FILE) if server is not None else {}
    if status == "ok" and (returncode not in (0, None) or not report_json):
        status, reason = "failed", f"exit code {returncode}" + ("" if report_json else ", no report written")
    record.update(status=status, reason=reason)
    if status == "ok":
        record["report"] = report_json
        from feddg.flare.registry import server_files

        for file in server_files():  # a method's kept file goes into the record too (its plot reads it there)
            content = read_json(server / file.name) if file.keep else None
            if content:
                record[file.key] = content
        for name in kept_files():
            if (server / name).exists():
                shutil.copy(server / name, folder / name)
    if status in ("ok", INTERRUPTED) and outcome.scratch is not None:
        shutil.rmtree(outcome.scratch, ignore_errors=True)
    return record


def case_scores_of(report: dict[str, Any]) -> dict[str, Any]:
    """Every per-case score of a run's report: model -> site -> split -> the split's per-case entries."""
    from feddg.flare.payloads import CASES

    return {model: {site: {split: summary.get(CASES) for split, summary in entry.get("splits", {}).items()}
                    for site, entry in evaluation.get("sites", {}).items()}
            for model, evaluation in report.get("models", {}).items()}


def admitted_codes(out: Path, records: dict[str, dict]) -> set[str]:
    """The code fingerprints whose runs belong in the folder ``out`` with ``records``: the codes of its finished
    runs and each code a reproduce check admitted (``sweep.json``'s ``code_evidence``: a check of every method that
    came out identical; an entry of the older one-cell checks counts when it says identical)."""
    evidence = read_json(out / SWEEP_FILE).get("code_evidence", [])
    admitted = {e["to_code"] for e in evidence if isinstance(e, dict) and "to_code" in e
                and (e["admitted"] if "methods" in e else e.get("identical", True))}
    return {str(r.get("code", "unknown")) for r in finished(records.values())} | admitted


def reproduce_cells(out: Path, records: dict[str, dict], protocol: Protocol,
                    family: str = "unknown") -> dict[str, dict]:
    """Method -> the run the reproduce check re-runs for it, for every method with a finished run in the folder: a
    finished run of the sweep's numbers ``family`` (a run repeats only on its own: :mod:`feddg.numerics`; any
    family when the sweep's is unknown), among the folder's runs and those moved aside under this protocol (a run
    moved for its seed's family still measures its code), seed 0 where there is one, on the held-out site with the
    fewest per-case scores (the quickest; ties by name). ConfigError naming the method and the family when
    a method has no such run: then nothing is run or written."""
    done = finished(records.values())
    aside = [r for name, r in run_records(out, under=ASIDE_DIR).items()
             if r.get("status") == "ok" and run_mismatch(protocol, name, r) is None]
    chosen = {}
    for method in sorted({r["run"]["method"] for r in done}):
        ours = [r for r in (*done, *aside) if r["run"]["method"] == method
                and family in ("unknown", run_family(r))]
        if not ours:
            raise ConfigError(f"{out}: --reproduce-check re-runs a finished run of every method on this machine's "
                              f"CPU family ({family}), and {method} has none (its runs: "
                              f"{', '.join(sorted({run_family(r) for r in done if r['run']['method'] == method}))}): "
                              f"run the check on a machine of that family")
        chosen[method] = min(ours, key=lambda r: (r["run"]["seed"] != 0, _n_scores(r), r["run"]["held_out"],
                                                  r["run"]["seed"]))
    return chosen


def _n_scores(record: dict[str, Any]) -> int:
    return sum(len(cases or {}) for sites in case_scores_of(record.get("report", {})).values()
               for splits in sites.values() for cases in splits.values())


def check_code(out: Path, records: dict[str, dict], protocol: Protocol, timeout: float, reproduce: bool,
               report: Callable[[str], None], executor: CellExecutor | None = None, cpu_pin: str = SWEEP_CPU_PIN,
               family: str = "unknown") -> None:
    """Refuse to add runs made by code other than the folder's (see the module docstring); with ``reproduce``,
    re-run one cell of every method the folder holds with this code (:func:`reproduce_cells`) and accept the code
    only when every per-case score of each is identical. The check, every method's cell, CPU model and result, is
    recorded in ``sweep.json`` (``code_evidence``) whatever its result; a refusal names the first method that
    differs and its first differing case."""
    from feddg.report import code_fingerprint, cpu_model

    current, here = code_fingerprint(), cpu_model()
    path = out / SWEEP_FILE
    done = {r["run_id"]: r for r in sorted(finished(records.values()), key=lambda r: r["run_id"])}
    made_by = sorted({str(r.get("code", "unknown")) for r in done.values()})
    if current in admitted_codes(out, records) or not done:
        return
    if not reproduce:
        raise ConfigError(
            f"{out}: its {len(done)} finished run(s) were made by code {', '.join(c[:12] for c in made_by)}; "
            f"this code is {current[:12]}. A results folder holds one code version: use another --out, or "
            f"--reproduce-check to re-run one cell of each of its methods with this code first (accepted only when "
            f"every per-case score is identical)")
    chosen = reproduce_cells(out, records, protocol, family)  # refused here, before anything runs
    report(f"reproduce check: re-running {', '.join(r['run_id'] for r in chosen.values())} with code "
           f"{current[:12]}")
    scratch = out / REPRODUCE_DIR
    shutil.rmtree(scratch, ignore_errors=True)
    new: dict[str, dict[str, Any]] = {}
    tails: dict[str, str] = {}
    try:
        cells = [prepare_cell(Run(**old["run"]), protocol, scratch, timeout, cpu_pin) for old in chosen.values()]
        executor = executor or LocalExecutor()
        executor.check(cells)
        _run_cells(protocol, cells, executor, report, lambda cell, record: new.update({cell.run_id: record}))
    finally:
        for old in chosen.values():
            log = scratch / "runs" / old["run_id"] / "simulate.log"
            tails[old["run_id"]] = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        shutil.rmtree(scratch, ignore_errors=True)
    checks, refusal = [], None
    for method, old in chosen.items():
        rid, rerun = old["run_id"], new.get(old["run_id"], {})
        entry = {"method": method, "run_id": rid, "from_code": old.get("code", "unknown"),
                 "made_on": run_cpu(old), "family": run_family(old), "status": rerun.get("status", "not run")}
        if rerun.get("status") != "ok":
            entry["identical"] = False
            refusal = refusal or (f"reproduce check: {method}'s {rid} did not finish with this code "
                                  f"({rerun.get('status')}: {rerun.get('reason')}); log tail:\n{tails[rid]}")
        else:
            difference = first_difference(case_scores_of(old["report"]), case_scores_of(rerun["report"]))
            entry.update(identical=difference is None, per_case_scores_compared=_n_scores(rerun))
            if difference is not None:
                entry["first_difference"] = difference.describe("with the old code", "with this code")
                cpu = "" if family != "unknown" else (
                    f". That run was made on {run_family(old)}, and where the runs were made now is not known here: "
                    f"a run repeats only on its CPU family (feddg.numerics.numbers_family)")
                refusal = refusal or (f"reproduce check: {method} ({rid}) gives other per-case scores with code "
                                      f"{current[:12]} ({entry['first_difference']}); this code cannot add runs to "
                                      f"{out}: use another --out{cpu}")
        checks.append(entry)
    recorded = read_json(path)
    evidence = [*recorded.get("code_evidence", []),
                {"to_code": current, "cpu": here, "family": family, "admitted": refusal is None, "methods": checks,
                 "checked": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}]
    write_json(path, {**recorded, "code_evidence": evidence}, indent=2)
    if refusal is not None:
        raise ConfigError(refusal)
    n_cases = sum(c["per_case_scores_compared"] for c in checks)
    report(f"reproduce check: {len(checks)} method(s) identical in all {n_cases} per-case scores; code "
           f"{current[:12]} accepted")


def estimate(protocol: Protocol, records: dict[str, dict], todo: Sequence[Run]) -> tuple[float, str]:
    """(seconds per run, where that figure comes from) for the runs still to do: the folder's finished runs'
    mean wall time, else the pilot's seconds per round (:data:`PILOT_SECONDS_PER_ROUND`) times the rounds."""
    walls = [r["wall_s"] for r in finished(records.values())]
    if walls:
        return sum(walls) / len(walls), f"mean of the folder's {len(walls)} finished runs"
    rounds = run_experiment(protocol, todo[0])["train"]["rounds"] if todo else 0
    per_round = PILOT_SECONDS_PER_ROUND.get(protocol.task)
    if not per_round:
        return 0.0, "no estimate: no finished run and no pilot for this task"
    return per_round * rounds, (f"the pilot's {per_round:.1f} s per FedAvg round on a 2-core CPU x {rounds} rounds; "
                                f"methods with heavier local training take longer")


def sweep(out: Path, protocol: Protocol, methods: Sequence[str], held_out: Sequence[str], seeds: Sequence[int],
          timeout: float = 3600, retry_failed: bool = False, reproduce_check: bool = False, dry_run: bool = False,
          move_aside: bool = False, report: Callable[[str], None] = print,
          after_run: Callable[[], None] | None = None, executor: CellExecutor | None = None,
          cpu_pin: str = SWEEP_CPU_PIN) -> list[dict]:
    """Run every cell not run yet; returns every cell's record (finished earlier or now; a dry run returns the
    finished ones and runs nothing). Before any run: every cell is validated, the data (with a data root) checked,
    and the folder's record checked (its protocol, each run's config: :mod:`feddg.benchmark.record`; with
    ``move_aside`` a run of another protocol is moved to ``OUT/aside/``); then the plan and its estimated machine
    time are printed. ``after_run`` is called after each run (the CLI rewrites the tables then, so an interrupted
    sweep leaves tables of what it finished). ``executor`` runs the cells (:mod:`feddg.benchmark.executors`; by
    default one local simulator run at a time); it checks them before any run, the reproduce check's included. A
    stop signal ends it with :class:`Interrupted`; the folder's lock is released on every way out. ``cpu_pin``: the
    runs' CPU numerics (:mod:`feddg.numerics`). A run repeats only on its numbers family (the CPU's maker and
    kernels), so each seed's runs come from one (:func:`~feddg.benchmark.record.seed_families`): a run of another
    family than its seed's is refused like a run of another protocol, and a sweep running on this host leaves the
    cells of a seed held by another family to a machine of that family, saying which."""
    executor = executor or LocalExecutor()
    family = this_family(executor, cpu_pin)
    with handle_stop_signals():
        runs = plan(protocol, methods, held_out, seeds)  # every run valid before the folder is touched
        if executor.data_here and (move_aside or _split(runs, run_records(out), retry_failed)[1]):
            check_real_data(protocol, runs[0], report)
        if dry_run:
            prepare_folder(out, protocol, report, write=False)
            check_records(out, protocol, move_aside, report, write=False)
            done, todo = _split(runs, run_records(out), retry_failed)
            todo = _ours(todo, run_records(out), family, report)
            _report_plan(protocol, runs, done, todo, report)
            return list(done.values())
        with _undone_if_refused(Path(out)) as accepted:
            with folder_lock(out, report):
                prepare_folder(out, protocol, report)
                check_records(out, protocol, move_aside, report)
                folder = run_records(out)
                done, todo = _split(runs, folder, retry_failed)
                todo = _ours(todo, folder, family, report)
                _report_plan(protocol, runs, done, todo, report)
                cells = [prepare_cell(run, protocol, out, timeout, cpu_pin) for run in todo]
                try:
                    if cells:
                        executor.check(cells)  # refused in one line before any run, the reproduce check's included
                        check_code(out, folder, protocol, timeout, reproduce_check, report, executor, cpu_pin,
                                   family)
                    record_design(out, methods, held_out, seeds)  # accepted: a refused sweep leaves it as it was
                    accepted()
                    _run_all(protocol, runs, done, cells, executor, report, after_run)
                finally:  # a cell that was never run leaves no folder (one that ran has its run.json)
                    for cell in cells:
                        if not (cell.folder / RUN_FILE).exists():
                            shutil.rmtree(cell.folder, ignore_errors=True)
                return [done[r.run_id] for r in runs if r.run_id in done]


def this_family(executor: CellExecutor, cpu_pin: str) -> str:
    """The numbers family of the runs ``executor`` makes with ``cpu_pin`` (:func:`feddg.numerics.numbers_family`):
    this host's when they run here, ``unknown`` when they run elsewhere (their records say it afterwards)."""
    from feddg.report import cpu_model

    if not executor.runs_here:
        return "unknown"
    return numbers_family(cpu_model(), cpu_pin if executor.applies_cpu_pin else "off", "avx512f" in cpu_flags())


def _ours(todo: list[Run], records: dict[str, dict], family: str, report: Callable[[str], None]) -> list[Run]:
    """The runs of ``todo`` this sweep may make: all, unless it knows its ``family`` and a seed's finished runs come
    from another (:func:`~feddg.benchmark.record.seed_families`); those cells are left, with a line naming them and
    the family that can run them."""
    owners = seed_families(records.values())
    left = [r for r in todo if family != "unknown" and owners.get(r.seed, family) != family]
    if left:
        by_family: dict[str, list[int]] = {}
        for seed in sorted({r.seed for r in left}):
            by_family.setdefault(owners[seed], []).append(seed)
        held = "; ".join(f"seed(s) {', '.join(map(str, seeds))} on {f}" for f, seeds in by_family.items())
        report(f"{len(left)} cell(s) left for a machine of their seed's CPU family ({held}): this sweep makes "
               f"{family} runs, and a pair's two runs must come from one family")
    return [r for r in todo if r not in left]


@contextmanager
def _undone_if_refused(out: Path) -> Iterator[Callable[[], None]]:
    """Create ``out`` (marked as ours, :func:`feddg.folders.claim`) for the block; the block calls the function it
    is given once the sweep is accepted. If the block ends before that (a refusal: the executor's check, a cluster
    that cannot be reached, the code check), what it wrote is undone: a ``sweep.json`` it wrote into a folder that
    had none, and the folder itself when the block made it, so that a refused sweep neither locks the folder to a
    protocol that never ran nor leaves a folder behind."""
    made, had_protocol = not out.exists(), (out / SWEEP_FILE).exists()
    claim(out, "feddg benchmark --out")
    state = {"accepted": False}
    try:
        yield lambda: state.update(accepted=True)
    finally:
        if not state["accepted"]:
            if made:
                shutil.rmtree(out, ignore_errors=True)
            elif not had_protocol:
                (out / SWEEP_FILE).unlink(missing_ok=True)


def _split(runs: Sequence[Run], records: dict[str, dict], retry_failed: bool) -> tuple[dict[str, dict], list[Run]]:
    """(run id -> record of each run that needs no new run, the runs to do): a run is done when it finished, or
    failed or timed out and ``retry_failed`` is off; one without a record, or interrupted, is to do."""
    done, todo = {}, []
    for run in runs:
        record = records.get(run.run_id) or {}
        status = record.get("status")
        if status == "ok" or (status and status != INTERRUPTED and not retry_failed):
            done[run.run_id] = record
        else:
            todo.append(run)
    return done, todo


def _report_plan(protocol: Protocol, runs: Sequence[Run], done: dict[str, dict], todo: Sequence[Run],
                 report: Callable[[str], None]) -> None:
    per_run, source = estimate(protocol, done, todo)
    left = len(runs) - len(done) - len(todo)  # cells left for a machine of another CPU family (_ours)
    report(f"{len(runs)} runs, {len(done)} done before, {f'{left} left for another machine, ' if left else ''}"
           f"{len(todo)} to run: about "
           f"{per_run * len(todo) / 3600:.1f} run-hours at {per_run:.0f} s per run ({source}; runs made at once "
           f"share the wall time)")


def _run_all(protocol: Protocol, runs: Sequence[Run], done: dict[str, dict], cells: Sequence[Cell],
             executor: CellExecutor, report: Callable[[str], None], after_run: Callable[[], None] | None) -> None:
    """Run ``cells`` with ``executor``, adding each record to ``done`` as it ends and calling ``after_run`` after
    each (signals wait for its end); the time left is estimated from this sweep's pace, which counts the runs that
    go on at once."""
    if not cells:
        return
    report(f"running {len(cells)} run(s): {executor.describe()}")
    started, first = time.perf_counter(), len(done)  # runs left for another machine are neither

    def recorded(cell: Cell, record: dict[str, Any]) -> None:
        done[cell.run_id] = record
        finished = len(done) - first
        note = f"{record['wall_s']:.0f} s" if record["status"] == "ok" else \
            f"{record['status'].upper()}: {record['reason']} (log {record['log']})"
        pace = (time.perf_counter() - started) / finished
        left = f", about {pace * (len(cells) - finished) / 60:.0f} min left" if finished < len(cells) else ""
        report(f"[{first + finished}/{len(runs)}] {cell.run_id}: {note}{left}")
        if after_run is not None:
            after_run()

    _run_cells(protocol, cells, executor, report, recorded)
