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

A folder holds one code version: every run records the fingerprint of the code that ran it
(:func:`feddg.report.code_fingerprint`), and a sweep whose code differs from the folder's runs is refused, unless
``reproduce_check`` first re-runs one finished cell with the new code and every per-case score comes out identical
(the evidence goes to ``sweep.json`` and ``results.json``).

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
REPRODUCE_DIR = "reproduce"  # where the reproduce check re-runs a cell (removed afterwards)
KEPT_FILES = ("feddg_report.json", "ga_weights.json", "feddg_timings.jsonl", "feddg_progress.json")


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


def default_overrides(task: str, synthetic: bool) -> dict[str, Any]:
    """The sweep's protocol for ``task`` before the user's ``--set``: :data:`SWEEP_ROUNDS` rounds of one local
    epoch and, on synthetic data, :data:`SYNTHETIC_HELD_OUT_CASES` test cases at the held-out site."""
    out: dict[str, Any] = {"train": {"rounds": SWEEP_ROUNDS[task], "local_epochs": 1}}
    if synthetic:
        out["data"] = {"synthetic": {"held_out_cases": SYNTHETIC_HELD_OUT_CASES[task]}}
    return out


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
    if not read_json(out / SWEEP_FILE):
        write_json(out / SWEEP_FILE, protocol.settings(), indent=2)
        return
    _check_protocol(out, protocol)


def _check_protocol(out: Path, protocol: Protocol) -> None:
    path = out / SWEEP_FILE
    recorded = read_json(path)
    for key, value in protocol.settings().items():
        if recorded.get(key) != value:
            raise ConfigError(f"{path}: this results folder was made with {key} = {json.dumps(recorded.get(key))}, "
                              f"this sweep has {json.dumps(value)}; use another --out for another protocol")


def plan(protocol: Protocol, methods: Sequence[str], held_out: Sequence[str], seeds: Sequence[int]) -> list[Run]:
    """The runs, held-out sites outermost (an interrupted sweep leaves whole columns of the table); each validated
    before anything runs (an unknown method, site or key fails here, naming it, and so does a protocol under which
    a method would not act, e.g. GA with one round)."""
    from feddg.config import config_from_dict
    from feddg.flare.registry import method

    runs = [Run(protocol.task, m, h, s) for h in held_out for m in methods for s in seeds]
    for run in runs:
        reason = method(run.method).inactive_reason(config_from_dict(run_experiment(protocol, run)))
        if reason:
            raise ConfigError(f"{run.method} would not act under this protocol ({run.run_id}): {reason}")
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
    from feddg.report import code_fingerprint

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
                              "log": str(log), "config": exp, "code": code_fingerprint()}
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


def case_scores_of(report: dict[str, Any]) -> dict[str, Any]:
    """Every per-case score of a run's report: model -> site -> split -> the split's per-case entries."""
    from feddg.flare.payloads import CASES

    return {model: {site: {split: summary.get(CASES) for split, summary in entry.get("splits", {}).items()}
                    for site, entry in evaluation.get("sites", {}).items()}
            for model, evaluation in report.get("models", {}).items()}


def _first_difference(a: Any, b: Any, path: str = "") -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                return f"{path}/{key} is in one run only"
            found = _first_difference(a[key], b[key], f"{path}/{key}")
            if found:
                return found
        return None
    return None if a == b else f"{path}: {a!r} then {b!r}"


def check_code(out: Path, records: dict[str, dict], protocol: Protocol, timeout: float, reproduce: bool,
               report: Callable[[str], None]) -> None:
    """Refuse to add runs made by code other than the folder's (see the module docstring); with ``reproduce``,
    re-run the folder's first finished cell with this code and accept the code when every per-case score is
    identical, recording the evidence in ``sweep.json``."""
    from feddg.report import code_fingerprint

    current = code_fingerprint()
    path = out / SWEEP_FILE
    recorded = read_json(path)
    evidence = list(recorded.get("code_evidence", []))
    finished = {rid: r for rid, r in sorted(records.items()) if r.get("status") == "ok"}
    made_by = sorted({str(r.get("code", "unknown")) for r in finished.values()})
    accepted = set(made_by) | {e["to_code"] for e in evidence}
    if current in accepted or not finished:
        return
    if not reproduce:
        raise ConfigError(
            f"{out}: its {len(finished)} finished run(s) were made by code {', '.join(c[:12] for c in made_by)}; "
            f"this code is {current[:12]}. A results folder holds one code version: use another --out, or "
            f"--reproduce-check to re-run one of its cells with this code first (accepted only when every "
            f"per-case score is identical)")
    rid, old = next(iter(finished.items()))
    report(f"reproduce check: re-running {rid} with code {current[:12]} (made by {str(old.get('code'))[:12]})")
    scratch = out / REPRODUCE_DIR
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        new = execute(Run(**old["run"]), protocol, scratch, timeout, report)
    finally:
        evidence_log = scratch / "runs" / rid / "simulate.log"
        kept = evidence_log.read_text(errors="replace")[-2000:] if evidence_log.exists() else ""
        shutil.rmtree(scratch, ignore_errors=True)
    if new.get("status") != "ok":
        raise ConfigError(f"reproduce check: {rid} did not finish with this code ({new.get('status')}: "
                          f"{new.get('reason')}); log tail:\n{kept}")
    difference = _first_difference(case_scores_of(old["report"]), case_scores_of(new["report"]))
    if difference:
        raise ConfigError(f"reproduce check: {rid} gives other per-case scores with code {current[:12]} "
                          f"({difference}); this code cannot add runs to {out}: use another --out")
    n_cases = sum(len(cases or {}) for sites in case_scores_of(new["report"]).values()
                  for splits in sites.values() for cases in splits.values())
    evidence.append({"run_id": rid, "from_code": old.get("code", "unknown"), "to_code": current,
                     "per_case_scores_compared": n_cases, "identical": True,
                     "checked": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    report(f"reproduce check: {rid} identical in all {n_cases} per-case scores; code {current[:12]} accepted")
    write_json(path, {**recorded, "code_evidence": evidence}, indent=2)


def estimate(protocol: Protocol, records: dict[str, dict], todo: Sequence[Run]) -> tuple[float, str]:
    """(seconds per run, where that figure comes from) for the runs still to do: the folder's finished runs'
    mean wall time, else the pilot's seconds per round (:data:`PILOT_SECONDS_PER_ROUND`) times the rounds."""
    walls = [r["wall_s"] for r in records.values() if r.get("status") == "ok"]
    if walls:
        return sum(walls) / len(walls), f"mean of the folder's {len(walls)} finished runs"
    rounds = run_experiment(protocol, todo[0])["train"]["rounds"] if todo else 0
    per_round = PILOT_SECONDS_PER_ROUND.get(protocol.task)
    if not per_round:
        return 0.0, "no estimate: no finished run and no pilot for this task"
    return per_round * rounds, f"the pilot's {per_round:.1f} s per round on a 2-core CPU x {rounds} rounds"


def sweep(out: Path, protocol: Protocol, methods: Sequence[str], held_out: Sequence[str], seeds: Sequence[int],
          timeout: float = 3600, retry_failed: bool = False, reproduce_check: bool = False, dry_run: bool = False,
          report: Callable[[str], None] = print, after_run: Callable[[], None] | None = None) -> list[dict]:
    """Run every cell not run yet; returns every cell's record (finished earlier or now; a dry run returns the
    finished ones and runs nothing). It first prints the plan and its estimated machine time. ``after_run`` is
    called after each run (the CLI rewrites the tables then, so an interrupted sweep leaves tables of what it
    finished)."""
    runs = plan(protocol, methods, held_out, seeds)  # every run valid before the folder is touched
    if not dry_run:
        prepare_folder(out, protocol)
    elif (out / SWEEP_FILE).exists():
        _check_protocol(out, protocol)
    records: dict[str, dict] = {}
    todo = []
    for run in runs:
        record = read_json(out / "runs" / run.run_id / RUN_FILE)
        if record and (record.get("status") == "ok" or not retry_failed):
            records[run.run_id] = record
        else:
            todo.append(run)
    per_run, source = estimate(protocol, records, todo)
    report(f"{len(runs)} runs, {len(runs) - len(todo)} done before, {len(todo)} to run: about "
           f"{per_run * len(todo) / 3600:.1f} machine-hours at {per_run:.0f} s per run ({source})")
    if dry_run:
        return list(records.values())
    if todo:
        folder = {p.parent.name: read_json(p) for p in sorted(out.glob(f"runs/*/{RUN_FILE}"))}
        check_code(out, folder, protocol, timeout, reproduce_check, report)
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
