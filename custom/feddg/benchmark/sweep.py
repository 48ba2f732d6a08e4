"""The leave-one-site-out sweep: methods x held-out sites x seeds, each a real NVFlare simulator job.

Every run is the task's job of the template (:mod:`feddg.jobs`) with the sweep's protocol (``--set`` overrides,
the data root and layout) and the run's own settings (``data.unseen_site``, the seeds) merged in, validated by the
experiment schema, written to ``OUT/runs/<run id>/job`` and run with ``feddg simulate`` (every site at once, each
with its share of the cores), its time bounded. A run's outcome is ``OUT/runs/<run id>/run.json``: ``ok`` with the
report, or ``failed`` / ``timeout`` with the reason and the log's path (a failed run is shown as failed, never as a
number). The sweep resumes: a run with a ``run.json`` is not run again (``retry_failed`` retries failed ones).

A folder holds one protocol: ``OUT/sweep.json`` records the task and every setting that changes the numbers (the
overrides, the data root and layout, the simulator flags); a sweep with other settings is refused, naming the
setting that differs. Methods, held-out sites and seeds may be added to a folder later.

A seed changes the model initialisation, the data order, the augmentation and every seed the method draws from
(``train.seed``, and any ``*_seed`` setting of the method's section, e.g. MLA's encoder and attention seeds), never
the splits (``data.split_seed``) or the synthetic data (``data.synthetic.seed``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from feddg.config import ConfigError
from feddg.jsonfile import read_json, write_json

RUN_FILE = "run.json"
SWEEP_FILE = "sweep.json"
SERVER_RUN = Path("server") / "simulate_job"
KEPT_FILES = ("feddg_report.json", "ga_weights.json", "feddg_timings.jsonl", "feddg_progress.json")


@dataclass(frozen=True)
class Run:
    """One cell of the sweep."""

    task: str
    method: str
    held_out: str
    seed: int

    @property
    def run_id(self) -> str:
        return f"{self.task}_{self.method}_{self.held_out}_seed{self.seed}"


@dataclass
class Protocol:
    """What every run of a results folder shares (recorded in ``sweep.json``).

    Attributes:
        task: prostate or fundus.
        overrides: nested feddg.yaml settings applied to every run (from ``--set``, the data root and layout).
        simulator_args: flags passed to the simulator (``-gpu 0``).
    """

    task: str
    overrides: dict[str, Any] = field(default_factory=dict)
    simulator_args: list[str] = field(default_factory=list)

    def settings(self) -> dict[str, Any]:
        return {"task": self.task, "overrides": self.overrides, "simulator_args": self.simulator_args}


def seed_overrides(experiment: dict[str, Any], seed: int) -> dict[str, Any]:
    """The settings a run's seed sets: ``train.seed`` and every ``*_seed`` of a method's section; never
    ``data.split_seed`` or ``data.synthetic.seed``."""
    out: dict[str, Any] = {"train": {"seed": seed}}
    for section, values in experiment.items():
        if section in ("data", "train") or not isinstance(values, dict):
            continue
        seeds = {key: seed for key in values if key.endswith("_seed")}
        if seeds:
            out[section] = seeds
    return out


def run_overrides(protocol: Protocol, run: Run) -> dict[str, Any]:
    """What the run changes in its job of the template: the protocol, the held-out site and the seed."""
    from feddg.flare.registry import merge
    from feddg.jobs import experiment

    delta = merge(protocol.overrides, {"data": {"unseen_site": run.held_out}})
    return merge(delta, seed_overrides(merge(experiment(run.task, run.method), delta), run.seed))


def run_experiment(protocol: Protocol, run: Run) -> dict[str, Any]:
    """The run's feddg.yaml content, validated (ConfigError naming the field otherwise)."""
    from feddg.jobs import experiment

    return experiment(run.task, run.method, run_overrides(protocol, run))


def prepare_folder(out: Path, protocol: Protocol) -> None:
    """Create ``out`` with its ``sweep.json``, or check that an existing one holds the same protocol."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / SWEEP_FILE
    recorded = read_json(path)
    if not recorded:
        write_json(path, protocol.settings(), indent=2)
        return
    for key, value in protocol.settings().items():
        if recorded.get(key) != value:
            raise ConfigError(f"{path}: this results folder was made with {key} = {json.dumps(recorded.get(key))}, "
                              f"this sweep has {json.dumps(value)}; use another --out for another protocol")


def plan(protocol: Protocol, methods: Sequence[str], held_out: Sequence[str], seeds: Sequence[int]) -> list[Run]:
    """The runs, held-out sites outermost (an interrupted sweep leaves whole columns of the table); each validated
    before anything runs (an unknown method, site or key fails here, naming it)."""
    runs = [Run(protocol.task, m, h, s) for h in held_out for m in methods for s in seeds]
    for run in runs:
        run_experiment(protocol, run)
    return runs


def _progress_round(ws: Path) -> int | None:
    progress = read_json(ws / SERVER_RUN / "feddg_progress.json")
    return progress.get("rounds_completed")


# NVFlare 2.9's simulator picks a free port, frees it, and has a child process bind it; another process on the host
# can take it in between, and the simulator then waits for a child that never connects. A run that failed that way
# is run once more (its record counts the attempts); any other failure is the run's own.
PORT_RACE = "Address already in use"


def execute(run: Run, protocol: Protocol, out: Path, timeout: float,
            report: Callable[[str], None] = print) -> dict[str, Any]:
    """Run one cell in the simulator (twice at most, see :data:`PORT_RACE`) and record its outcome in
    ``out/runs/<id>/run.json``."""
    record = _execute_once(run, protocol, out, timeout, report)
    if record["status"] != "ok" and PORT_RACE in Path(record["log"]).read_text(errors="replace"):
        report(f"    {run.run_id}: the simulator lost a port to another process ({PORT_RACE}); running it again")
        record = _execute_once(run, protocol, out, timeout, report)
        record["attempts"] = 2
        write_json(out / "runs" / run.run_id / RUN_FILE, record, indent=2)
    return record


def _execute_once(run: Run, protocol: Protocol, out: Path, timeout: float,
                  report: Callable[[str], None]) -> dict[str, Any]:
    from feddg.jobs import experiment, write_job

    folder = out / "runs" / run.run_id
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    delta = run_overrides(protocol, run)
    exp = experiment(run.task, run.method, delta)
    job = write_job(folder, f"{run.task}_{run.method}", delta)
    ws, log = folder / "ws", folder / "simulate.log"
    rounds = exp["train"]["rounds"]
    command = [sys.executable, "-m", "feddg.cli", "simulate", str(job), "-w", str(ws), *protocol.simulator_args]
    started = time.perf_counter()
    status, reason = "ok", ""
    with open(log, "w") as f:
        proc = subprocess.Popen(command, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        last = None
        while proc.poll() is None:
            elapsed = time.perf_counter() - started
            if elapsed > timeout:
                os.killpg(proc.pid, signal.SIGKILL)  # the group this sweep started: the simulator and its sites
                proc.wait()
                status, reason = "timeout", f"stopped after {timeout:.0f} s"
                break
            done = _progress_round(ws)
            if done != last:
                report(f"    {run.run_id}: {done or 0}/{rounds} rounds after {elapsed:.0f} s")
                last = done
            time.sleep(2)
    wall = time.perf_counter() - started
    record: dict[str, Any] = {"run": run.__dict__, "run_id": run.run_id, "status": status, "wall_s": round(wall, 1),
                              "log": str(log), "config": exp}
    server = ws / SERVER_RUN
    report_json = read_json(server / "feddg_report.json")
    if status == "ok" and (proc.returncode != 0 or not report_json):
        status, reason = "failed", f"exit code {proc.returncode}" + ("" if report_json else ", no report written")
    record.update(status=status, reason=reason)
    if status == "ok":
        record["report"] = report_json
        ga = read_json(server / "ga_weights.json")
        if ga:
            record["ga_weights"] = ga
        for name in KEPT_FILES:  # what the tables and plots need; the workspace (models, logs) is removed
            if (server / name).exists():
                shutil.copy(server / name, folder / name)
        shutil.rmtree(ws, ignore_errors=True)
    write_json(folder / RUN_FILE, record, indent=2)
    return record


def sweep(out: Path, protocol: Protocol, methods: Sequence[str], held_out: Sequence[str], seeds: Sequence[int],
          timeout: float = 3600, retry_failed: bool = False, report: Callable[[str], None] = print,
          after_run: Callable[[], None] | None = None) -> list[dict]:
    """Run every cell not run yet; returns every cell's record (finished earlier or now). ``after_run`` is called
    after each run (the CLI rewrites the tables then, so an interrupted sweep leaves tables of what it finished)."""
    runs = plan(protocol, methods, held_out, seeds)  # every run valid before the folder is touched
    prepare_folder(out, protocol)
    records: dict[str, dict] = {}
    todo = []
    for run in runs:
        record = read_json(out / "runs" / run.run_id / RUN_FILE)
        if record and (record.get("status") == "ok" or not retry_failed):
            records[run.run_id] = record
        else:
            todo.append(run)
    report(f"{len(runs)} runs, {len(runs) - len(todo)} done before, {len(todo)} to run")
    walls = [r["wall_s"] for r in records.values() if r.get("status") == "ok"]
    for i, run in enumerate(todo):
        eta = f", about {(sum(walls) / len(walls)) * (len(todo) - i) / 60:.0f} min left" if walls else ""
        report(f"[{len(runs) - len(todo) + i + 1}/{len(runs)}] {run.run_id}{eta}")
        record = execute(run, protocol, out, timeout, report)
        records[run.run_id] = record
        note = f"{record['wall_s']:.0f} s" if record["status"] == "ok" else \
            f"{record['status'].upper()}: {record['reason']} (log {record['log']})"
        report(f"    {run.run_id}: {note}")
        if record["status"] == "ok":
            walls.append(record["wall_s"])
        if after_run is not None:
            after_run()
    return [records[r.run_id] for r in runs]
