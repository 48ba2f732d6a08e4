"""The leave-one-site-out sweep: methods x held-out sites x seeds, each a real NVFlare simulator job.

Every run is the task's job of the template (:mod:`feddg.jobs`) with the sweep's protocol (``--set`` overrides,
the data root and layout) and the run's own settings (``data.unseen_site``, the seeds) merged in, validated by the
experiment schema (:mod:`feddg.benchmark.protocol`), written to ``OUT/runs/<run id>/job`` and run with ``feddg
simulate`` (every site at once, each with its share of the cores), its time bounded. A run's outcome is
``OUT/runs/<run id>/run.json``: ``ok`` with the report, or ``failed`` / ``timeout`` with the reason and the log's
path (a failed run is shown as failed, never as a number). The sweep resumes: a run with a ``run.json`` is not run
again (``retry_failed`` retries failed ones; an interrupted one is always run again).

A folder holds one protocol, and its record is checked, not trusted (:mod:`feddg.benchmark.record`): ``OUT/sweep.json``
records the task and every setting that changes the numbers; a sweep with other settings is refused, naming the
first setting that differs with both values, and so is a folder holding a run whose own config is not the
protocol's for its cell. Methods, held-out sites and seeds may be added to a folder later. One sweep works on a
folder at a time (``OUT/.sweep.lock``). With a data root the data are checked once, as ``feddg check-data`` does,
before any run.

A folder holds one code version: every run records the fingerprint of the code that ran it
(:func:`feddg.report.code_fingerprint`), and a sweep whose code differs from the folder's runs is refused, unless
``reproduce_check`` first re-runs one finished cell with the new code and every per-case score comes out identical
(the evidence goes to ``sweep.json`` and ``results.json``).

SIGINT (Ctrl-C) and SIGTERM stop the run in progress with every process it started (the simulator starts its site
workers in sessions of their own: :mod:`feddg.process_tree`), record it as ``interrupted`` and end the sweep with
:class:`Interrupted`; a run that finished before the signal keeps its record.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from feddg.benchmark.protocol import (Protocol, Run, first_difference, owned_settings, run_experiment,
                                      run_overrides, seed_overrides)
from feddg.benchmark.record import (INTERRUPTED, RUN_FILE, SWEEP_FILE, check_records, folder_lock,
                                    prepare_folder, run_records)
from feddg.benchmark.signals import STOP_SIGNALS, Interrupted, handle_stop_signals
from feddg.config import ConfigError
from feddg.jsonfile import read_json, write_json

SERVER_RUN = Path("server") / "simulate_job"
REPRODUCE_DIR = "reproduce"  # where the reproduce check re-runs a cell (removed afterwards)
KEPT_FILES = ("feddg_report.json", "ga_weights.json", "feddg_timings.jsonl", "feddg_progress.json")
POLL_S = 0.5  # how often a run's simulator is looked at (its end, its rounds, a signal, its time)
KILL_WAIT_S = 20.0  # how long a stopped run's processes may take to be gone

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


def default_overrides(task: str, synthetic: bool) -> dict[str, Any]:
    """The sweep's protocol for ``task`` before the user's ``--set``: :data:`SWEEP_ROUNDS` rounds of one local
    epoch and, on synthetic data, :data:`SYNTHETIC_HELD_OUT_CASES` test cases at the held-out site."""
    out: dict[str, Any] = {"train": {"rounds": SWEEP_ROUNDS[task], "local_epochs": 1}}
    if synthetic:
        out["data"] = {"synthetic": {"held_out_cases": SYNTHETIC_HELD_OUT_CASES[task]}}
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


def plan(protocol: Protocol, methods: Sequence[str], held_out: Sequence[str], seeds: Sequence[int]) -> list[Run]:
    """The runs, held-out sites outermost (an interrupted sweep leaves whole columns of the table); each validated
    before anything runs (an unknown method, site or key fails here, naming it, and so do a setting the sweep sets
    itself, e.g. ``train.seed``, and a protocol under which a method would not act, e.g. GA with one round)."""
    from feddg.config import config_from_dict
    from feddg.flare.registry import method

    owned = owned_settings(protocol.overrides)
    if owned:
        raise ConfigError("; ".join(owned))
    runs = [Run(protocol.task, m, h, s) for h in held_out for m in methods for s in seeds]
    for run in runs:
        reason = method(run.method).inactive_reason(config_from_dict(run_experiment(protocol, run)))
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


def _progress_round(ws: Path) -> int | None:
    progress = read_json(ws / SERVER_RUN / "feddg_progress.json")
    return progress.get("rounds_completed")


# NVFlare 2.9's simulator picks a free port, frees it, and has a child process bind it; another process on the host
# can take it in between, and the simulator then waits for a child that never connects. A run that failed that way
# is run once more (its record counts the attempts); any other failure is the run's own.
PORT_RACE = "Address already in use"


def simulate_command(job: Path, workspace: Path, simulator_args: Sequence[str]) -> list[str]:
    """The command that runs one job: ``feddg simulate`` with the protocol's simulator flags after ``--``."""
    return [sys.executable, "-m", "feddg.cli", "simulate", str(job), "-w", str(workspace), "--", *simulator_args]


def execute(run: Run, protocol: Protocol, out: Path, timeout: float,
            report: Callable[[str], None] = print) -> dict[str, Any]:
    """Run one cell in the simulator (twice at most, see :data:`PORT_RACE`) and record its outcome in
    ``out/runs/<id>/run.json``; :class:`Interrupted` after recording it when a stop signal came."""
    record = _execute_once(run, protocol, out, timeout, report)
    if record["status"] != "ok" and PORT_RACE in Path(record["log"]).read_text(errors="replace"):
        report(f"    {run.run_id}: the simulator lost a port to another process ({PORT_RACE}); running it again")
        record = _execute_once(run, protocol, out, timeout, report)
        record["attempts"] = 2
        write_json(out / "runs" / run.run_id / RUN_FILE, record, indent=2)
    return record


def _execute_once(run: Run, protocol: Protocol, out: Path, timeout: float,
                  report: Callable[[str], None]) -> dict[str, Any]:
    from feddg.jobs import write_job

    folder = out / "runs" / run.run_id
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    exp = run_experiment(protocol, run)
    job = write_job(folder, f"{run.task}_{run.method}", run_overrides(protocol, run))
    ws, log = folder / "ws", folder / "simulate.log"
    with STOP_SIGNALS.deferred():  # from the start of the simulator to its record: a signal stops the run, then ends
        started = time.perf_counter()
        with open(log, "w") as f:
            proc = subprocess.Popen(simulate_command(job, ws, protocol.simulator_args), stdout=f,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            status, reason = _supervise(proc, ws, timeout, run.run_id, exp["train"]["rounds"], report)
        record = _outcome(run, protocol, exp, folder, status, reason, proc.returncode, time.perf_counter() - started)
        write_json(folder / RUN_FILE, record, indent=2)
        STOP_SIGNALS.raise_received(run.run_id if status == INTERRUPTED else None)
    return record


def _supervise(proc: subprocess.Popen, ws: Path, timeout: float, run_id: str, rounds: int,
               report: Callable[[str], None]) -> tuple[str, str]:
    """Wait for the simulator ``proc``, reporting its rounds, and stop it with every process it started when it runs
    past ``timeout`` or a stop signal comes. Returns (status, reason): ``ok`` when it ended by itself (its exit code
    and report decide later), ``timeout`` or ``interrupted``."""
    started, last = time.perf_counter(), None
    while proc.poll() is None:
        elapsed = time.perf_counter() - started
        signum = STOP_SIGNALS.received
        if signum is not None or elapsed > timeout:
            stuck = _stop(proc)
            if signum is not None:
                return INTERRUPTED, f"stopped by {signal.Signals(signum).name} after {elapsed:.0f} s{stuck}"
            return "timeout", f"stopped after {timeout:.0f} s{stuck}"
        done = _progress_round(ws)
        if done != last:
            report(f"    {run_id}: {done or 0}/{rounds} rounds after {elapsed:.0f} s")
            last = done
        time.sleep(POLL_S)
    return "ok", ""


def _stop(proc: subprocess.Popen) -> str:
    """Kill the simulator ``proc`` with every process it started (:func:`feddg.process_tree.kill_tree`) and reap it:
    "" when all are gone within :data:`KILL_WAIT_S`, else a note naming those still there."""
    from feddg.process_tree import kill_tree

    left, _ = kill_tree(proc.pid, KILL_WAIT_S)
    try:
        proc.wait(timeout=KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        left = [proc.pid, *left]
    return f"; process(es) {left} still there {KILL_WAIT_S:.0f} s after SIGKILL" if left else ""


def _outcome(run: Run, protocol: Protocol, exp: dict[str, Any], folder: Path, status: str, reason: str,
             returncode: int | None, wall: float) -> dict[str, Any]:
    """The run's record: its cell, status, wall time, log, config, simulator flags and code; a run that ended by
    itself is ``ok`` only with exit code 0 and a report, which the record then holds with the files the tables
    need (the workspace, with its models, is removed; so is an interrupted run's)."""
    from feddg.report import code_fingerprint

    record: dict[str, Any] = {"run": run.__dict__, "run_id": run.run_id, "status": status, "wall_s": round(wall, 1),
                              "log": str(folder / "simulate.log"), "config": exp,
                              "simulator_args": list(protocol.simulator_args), "code": code_fingerprint()}
    ws = folder / "ws"
    server = ws / SERVER_RUN
    report_json = read_json(server / "feddg_report.json")
    if status == "ok" and (returncode != 0 or not report_json):
        status, reason = "failed", f"exit code {returncode}" + ("" if report_json else ", no report written")
    record.update(status=status, reason=reason)
    if status == "ok":
        record["report"] = report_json
        ga = read_json(server / "ga_weights.json")
        if ga:
            record["ga_weights"] = ga
        for name in KEPT_FILES:  # what the tables and plots need; the workspace (models, logs) is removed
            if (server / name).exists():
                shutil.copy(server / name, folder / name)
    if status in ("ok", INTERRUPTED):
        shutil.rmtree(ws, ignore_errors=True)
    return record


def case_scores_of(report: dict[str, Any]) -> dict[str, Any]:
    """Every per-case score of a run's report: model -> site -> split -> the split's per-case entries."""
    from feddg.flare.payloads import CASES

    return {model: {site: {split: summary.get(CASES) for split, summary in entry.get("splits", {}).items()}
                    for site, entry in evaluation.get("sites", {}).items()}
            for model, evaluation in report.get("models", {}).items()}


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
    difference = first_difference(case_scores_of(old["report"]), case_scores_of(new["report"]))
    if difference:
        raise ConfigError(f"reproduce check: {rid} gives other per-case scores with code {current[:12]} "
                          f"({difference.describe('with the old code', 'with this code')}); this code cannot add "
                          f"runs to {out}: use another --out")
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
    return per_round * rounds, (f"the pilot's {per_round:.1f} s per FedAvg round on a 2-core CPU x {rounds} rounds; "
                                f"methods with heavier local training take longer")


def sweep(out: Path, protocol: Protocol, methods: Sequence[str], held_out: Sequence[str], seeds: Sequence[int],
          timeout: float = 3600, retry_failed: bool = False, reproduce_check: bool = False, dry_run: bool = False,
          move_aside: bool = False, report: Callable[[str], None] = print,
          after_run: Callable[[], None] | None = None) -> list[dict]:
    """Run every cell not run yet; returns every cell's record (finished earlier or now; a dry run returns the
    finished ones and runs nothing). Before any run: every cell is validated, the data (with a data root) checked,
    and the folder's record checked (its protocol, each run's config: :mod:`feddg.benchmark.record`; with
    ``move_aside`` a run of another protocol is moved to ``OUT/aside/``); then the plan and its estimated machine
    time are printed. ``after_run`` is called after each run (the CLI rewrites the tables then, so an interrupted
    sweep leaves tables of what it finished). A stop signal ends it with :class:`Interrupted`; the folder's lock is
    released on every way out."""
    with handle_stop_signals():
        runs = plan(protocol, methods, held_out, seeds)  # every run valid before the folder is touched
        if move_aside or _split(runs, run_records(out), retry_failed)[1]:
            check_real_data(protocol, runs[0], report)
        if dry_run:
            prepare_folder(out, protocol, report, write=False)
            check_records(out, protocol, move_aside, report, write=False)
            done, todo = _split(runs, run_records(out), retry_failed)
            _report_plan(protocol, runs, done, todo, report)
            return list(done.values())
        Path(out).mkdir(parents=True, exist_ok=True)
        with folder_lock(out, report):
            prepare_folder(out, protocol, report)
            check_records(out, protocol, move_aside, report)
            folder = run_records(out)
            done, todo = _split(runs, folder, retry_failed)
            _report_plan(protocol, runs, done, todo, report)
            if todo:
                check_code(out, folder, protocol, timeout, reproduce_check, report)
            _run_all(out, protocol, runs, done, todo, timeout, report, after_run)
            return [done[r.run_id] for r in runs]


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
    report(f"{len(runs)} runs, {len(runs) - len(todo)} done before, {len(todo)} to run: about "
           f"{per_run * len(todo) / 3600:.1f} machine-hours at {per_run:.0f} s per run ({source})")


def _run_all(out: Path, protocol: Protocol, runs: Sequence[Run], done: dict[str, dict], todo: Sequence[Run],
             timeout: float, report: Callable[[str], None], after_run: Callable[[], None] | None) -> None:
    """Run ``todo`` in order, adding each record to ``done``, ``after_run`` after each (signals wait for its end)."""
    walls = [r["wall_s"] for r in done.values() if r.get("status") == "ok"]
    for i, run in enumerate(todo):
        eta = f", about {(sum(walls) / len(walls)) * (len(todo) - i) / 60:.0f} min left" if walls else ""
        report(f"[{len(runs) - len(todo) + i + 1}/{len(runs)}] {run.run_id}{eta}")
        record = execute(run, protocol, out, timeout, report)
        done[run.run_id] = record
        note = f"{record['wall_s']:.0f} s" if record["status"] == "ok" else \
            f"{record['status'].upper()}: {record['reason']} (log {record['log']})"
        report(f"    {run.run_id}: {note}")
        if record["status"] == "ok":
            walls.append(record["wall_s"])
        if after_run is not None:
            with STOP_SIGNALS.deferred():
                after_run()
