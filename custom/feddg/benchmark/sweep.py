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

A folder holds one code version: a sweep whose code differs from the folder's runs is refused unless its reproduce
check admits the code (:mod:`feddg.benchmark.reproduce`). A run's job, outcome and record are
:mod:`feddg.benchmark.cells`'.

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

from feddg.benchmark.cells import SWEEP_CPU_PIN, prepare_cell, run_cells
from feddg.benchmark.executors.base import Cell, CellExecutor
from feddg.benchmark.executors.local import LocalExecutor
from feddg.benchmark.protocol import Protocol, Run, owned_settings, run_experiment, run_overrides, seed_overrides
from feddg.benchmark.record import (INTERRUPTED, RUN_FILE, SWEEP_FILE, check_records, finished, folder_lock,
                                    prepare_folder, record_design, run_family, run_records, seed_families)
from feddg.benchmark.reproduce import check_code
from feddg.benchmark.signals import Interrupted, handle_stop_signals
from feddg.benchmark.stats import seed_list
from feddg.config import ConfigError
from feddg.folders import claim
from feddg.numerics import host_family

__all__ = ["Interrupted", "Protocol", "Run", "RUN_FILE", "SWEEP_FILE", "default_overrides",
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
    """The runs, held-out sites outermost, then seeds (an interrupted sweep leaves whole columns of the table and,
    in the column it stopped in, whole seeds: each method's run of a seed, the pairs the verdicts compare); each
    validated before anything runs (an unknown method, site or key fails here, naming it, and so do a setting the
    sweep sets itself, e.g. ``train.seed``, and a protocol under which a method would not act, e.g. GA with one
    round)."""
    from feddg.experiment import experiment_from_dict
    from feddg.flare.registry import method

    owned = owned_settings(protocol.overrides)
    if owned:
        raise ConfigError("; ".join(owned))
    runs = [Run(protocol.task, m, h, s) for h in held_out for s in seeds for m in methods]
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


def estimate(protocol: Protocol, records: dict[str, dict], todo: Sequence[Run],
             family: str = "unknown") -> tuple[float, str]:
    """(seconds for the runs still to do, where that figure comes from). Each run to do counts the mean wall time of
    the folder's finished runs of its method made on this numbers ``family`` (the CPU moves a run's time as it
    moves its numbers: :mod:`feddg.numerics`), else of its method on any family, else of every finished run; with
    no finished run, the pilot's seconds per round (:data:`PILOT_SECONDS_PER_ROUND`) times the rounds. The folder's
    runs were made as its sweeps made them (two at once take longer each than one alone), so the figure is for a
    sweep made the same way. ``records``: every run record of the folder, not just this sweep's cells: a sweep of
    new cells of a method the folder already ran learns from those runs."""
    ended = finished(records.values())
    if not todo:
        return 0.0, "nothing to run"
    if ended:
        by_method: dict[str, dict[str, list[float]]] = {}
        for r in ended:
            walls = by_method.setdefault(r["run"]["method"], {"here": [], "any": []})
            walls["any"].append(float(r["wall_s"]))
            if family != "unknown" and run_family(r) == family:  # runs made elsewhere: their family unknown
                walls["here"].append(float(r["wall_s"]))
        overall = sum(float(r["wall_s"]) for r in ended) / len(ended)
        per_method, sources = {}, []
        for method in dict.fromkeys(run.method for run in todo):
            walls = by_method.get(method, {"here": [], "any": []})
            pool, where = ((walls["here"], f"on {family}") if walls["here"] else
                           (walls["any"], "on any CPU") if walls["any"] else ([], ""))
            per_method[method] = sum(pool) / len(pool) if pool else overall
            sources.append(f"{method} {per_method[method]:.0f} s" + (
                f" ({len(pool)} {where})" if pool else f" (no run of it: the folder's mean over {len(ended)})"))
        total = sum(per_method[run.method] for run in todo)
        return total, f"each method's mean over the folder's finished runs: {', '.join(sources)}"
    rounds = run_experiment(protocol, todo[0])["train"]["rounds"]
    per_round = PILOT_SECONDS_PER_ROUND.get(protocol.task)
    if not per_round:
        return 0.0, "no estimate: no finished run and no pilot for this task"
    return per_round * rounds * len(todo), (f"{per_round * rounds:.0f} s per run: the pilot's {per_round:.1f} s per "
                                            f"FedAvg round on a 2-core CPU x {rounds} rounds; methods with heavier "
                                            f"local training take longer")


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
    sweep leaves tables of what it finished; an error there is reported and the runs go on). ``executor`` runs the
    cells (:mod:`feddg.benchmark.executors`; by default one local simulator run at a time); it checks them before
    any run, the reproduce check's included. A stop signal ends it with :class:`Interrupted`; the folder's lock is
    released on every way out. ``cpu_pin``: the runs' CPU numerics (:mod:`feddg.numerics`). A run repeats only on
    its numbers family (the CPU's maker and kernels), so each seed's runs come from one
    (:func:`~feddg.benchmark.record.seed_families`): a run of another family than its seed's is refused like a run
    of another protocol, and a sweep running on this host leaves the cells of a seed held by another family to a
    machine of that family, saying which."""
    executor = executor or LocalExecutor()
    family = this_family(executor, cpu_pin)
    with handle_stop_signals():
        runs = plan(protocol, methods, held_out, seeds)  # every run valid before the folder is touched
        if executor.data_here and (move_aside or _split(runs, run_records(out), retry_failed)[1]):
            check_real_data(protocol, runs[0], report)
        if dry_run:
            prepare_folder(out, protocol, report, write=False)
            check_records(out, protocol, move_aside, report, write=False)
            folder = run_records(out)
            done, todo = _split(runs, folder, retry_failed)
            todo = _ours(todo, folder, family, report)
            _report_plan(protocol, runs, done, todo, folder, family, report)
            return list(done.values())
        with _undone_if_refused(Path(out)) as accepted:
            with folder_lock(out, report):
                prepare_folder(out, protocol, report)
                check_records(out, protocol, move_aside, report)
                folder = run_records(out)
                done, todo = _split(runs, folder, retry_failed)
                todo = _ours(todo, folder, family, report)
                _report_plan(protocol, runs, done, todo, folder, family, report)
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
    """The numbers family of the runs ``executor`` makes with ``cpu_pin`` (:func:`feddg.numerics.host_family`):
    this host's when they run here, ``unknown`` when they run elsewhere (their records say it afterwards)."""
    if not executor.runs_here:
        return "unknown"
    return host_family(cpu_pin if executor.applies_cpu_pin else "off")


def _ours(todo: list[Run], records: dict[str, dict], family: str, report: Callable[[str], None]) -> list[Run]:
    """The runs of ``todo`` this sweep may make: all, unless it knows its ``family`` and a seed's finished runs come
    from another (:func:`~feddg.benchmark.record.seed_families`); those cells are left, with a line naming them and
    the family that can run them, and, when that leaves this sweep nothing, the first seed no family holds yet (one
    this machine can make: each seed is a draw of its own, so its family is whichever makes its first run)."""
    owners = seed_families(records.values())
    left = [r for r in todo if family != "unknown" and owners.get(r.seed, family) != family]
    if left:
        by_family: dict[str, list[int]] = {}
        for seed in sorted({r.seed for r in left}):
            by_family.setdefault(owners[seed], []).append(seed)
        held = "; ".join(f"{seed_list(seeds)} on {f}" for f, seeds in by_family.items())
        ours = [r for r in todo if r not in left]
        free = "" if ours else (f"; a seed no family holds yet can be made here (the first: "
                                f"{next(seed for seed in range(len(owners) + 1) if seed not in owners)})")
        report(f"{len(left)} cell(s) left for a machine of their seed's CPU family ({held}): this sweep makes "
               f"{family} runs, and a pair's two runs must come from one family{free}")
        return ours
    return todo


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
                 folder: dict[str, dict], family: str, report: Callable[[str], None]) -> None:
    seconds, source = estimate(protocol, folder, todo, family)
    left = len(runs) - len(done) - len(todo)  # cells left for a machine of another CPU family (_ours)
    report(f"{len(runs)} runs, {len(done)} done before, {f'{left} left for another machine, ' if left else ''}"
           f"{len(todo)} to run: about {seconds / 3600:.1f} run-hours ({source}; runs made at once share the wall "
           f"time)")


def _run_all(protocol: Protocol, runs: Sequence[Run], done: dict[str, dict], cells: Sequence[Cell],
             executor: CellExecutor, report: Callable[[str], None], after_run: Callable[[], None] | None) -> None:
    """Run ``cells`` with ``executor``, adding each record to ``done`` as it ends and calling ``after_run`` after
    each (signals wait for its end; an error it raises is reported and the sweep goes on); the time left is
    estimated from this sweep's pace, which counts the runs that go on at once."""
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
        if after_run is None:
            return
        try:
            after_run()
        except Exception as error:  # noqa: BLE001 - the tables are derived: a fault there must not stop the runs
            # going on beside this one (their record would be lost); the sweep's last write raises it again.
            report(f"the tables were not rewritten after {cell.run_id}: {type(error).__name__}: {error} (the runs "
                   f"go on; the records are kept)")

    run_cells(protocol, cells, executor, report, recorded)
