"""One cell of the sweep, from job to record: the cell's job folder written from the template with the protocol and
the run's own settings (:func:`prepare_cell`), run by an executor (:mod:`feddg.benchmark.executors`), and its outcome
written as ``OUT/runs/<run id>/run.json`` with the server files the tables keep (:func:`run_cells`). The sweep
(:mod:`feddg.benchmark.sweep`) and its reproduce check (:mod:`feddg.benchmark.reproduce`) run their cells here.

A ``run.json`` is written whole or not at all (an executor never writes one); a stop signal stops the cells in
progress, records each as ``interrupted`` and then raises :class:`~feddg.benchmark.signals.Interrupted`.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from feddg.benchmark.executors.base import Cell, CellExecutor, Outcome, final_model
from feddg.benchmark.executors.local import LocalExecutor
from feddg.benchmark.protocol import Protocol, Run, run_experiment, run_overrides
from feddg.benchmark.record import INTERRUPTED, RUN_FILE
from feddg.benchmark.signals import STOP_SIGNALS
from feddg.jsonfile import read_json, write_json
from feddg.report import REPORT_FILE, sites_absent

# The CPU numerics a cell runs with unless told otherwise (feddg.numerics): the machine's own kernels, since no pin
# makes a run repeat across CPU makers (feddg.numerics.numbers_family); each seed's runs stay within one family.
SWEEP_CPU_PIN = "off"


def kept_files() -> tuple[str, ...]:
    """The server files a finished run keeps beside its ``run.json`` (the rest of the workspace is removed): the
    report, the timings and the progress every job writes, and the files the registered methods ask the benchmark
    to keep. The final global model is kept too (:func:`~feddg.benchmark.executors.base.final_model`)."""
    from feddg.flare.constants import PROGRESS_FILE
    from feddg.flare.registry import server_files
    from feddg.flare.timings import TIMINGS_FILE

    return (REPORT_FILE, TIMINGS_FILE, PROGRESS_FILE, *(f.name for f in server_files() if f.keep))


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
    run_cells(protocol, [cell], executor, report, lambda c, record: records.update({c.run_id: record}))
    return records[run.run_id]


def run_cells(protocol: Protocol, cells: Sequence[Cell], executor: CellExecutor, report: Callable[[str], None],
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
    itself is ``ok`` only with exit code 0 (when it has one) and a report of all its sites (:func:`sites_absent`),
    which the record then holds. Beside the record go the server files the tables need (:func:`kept_files`) and the
    final global model (:func:`final_model`, about 2 MB for the default network, for analyses that score the
    trained model again, e.g. ``benchmarks/mask_volume.py``). The executor's scratch, e.g. the simulator workspace,
    is removed, and so is an interrupted run's."""
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
    absent = sites_absent(report_json, exp["data"]["sites"], run.held_out) if status == "ok" else None
    if absent is not None:  # not a protocol run: a site sat out
        status, reason = "failed", f"the run ended without every site: {absent}"
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
        model = final_model(server)
        if model is not None:
            shutil.copy(model, folder / model.name)
    if status in ("ok", INTERRUPTED) and outcome.scratch is not None:
        shutil.rmtree(outcome.scratch, ignore_errors=True)
    return record
