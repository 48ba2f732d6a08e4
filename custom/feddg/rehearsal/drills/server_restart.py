"""``server-restart``: the server is killed mid-job and started again from its kit; the run goes on as a resumed job.

A job of its own: once it has completed two rounds the server (its parent and job processes) is frozen, the
checksums of every file in the job's server run folder and of every finished job's stored result are taken, and the
server is killed (SIGKILL) and started again from its kit. Expected: those files unchanged, every hospital registered
with the new server without being restarted (same process ids), and ``feddg resume-job`` continuing the run from its
last completed round as a new job whose rounds, and every round history the job's methods keep on the server and a
resumed job carries forward (the registry's resumable server files, e.g. GA's weights), continue the old ones.

NVFlare 2.9 does not resume a job after a server restart, nor close it: its job store still lists it as running. The
drill records that status, aborts it as an operator would (``nvflare job abort``), and runs the resumed job instead.
"""

from __future__ import annotations

import hashlib
import json
import signal
import time
from pathlib import Path

import psutil

from feddg.flare.registry import server_files
from feddg.jsonfile import read_json_object
from feddg.poc import admin, download, submit, wait
from feddg.process_tree import send
from feddg.rehearsal.consortium import Rehearsal
from feddg.rehearsal.outcomes import DrillOutcome
from feddg.rehearsal.processes import (job_status, process_tree, rounds_completed, server_log_size, start_server,
                                       wait_for_rounds, wait_registered)
from feddg.resume import RESUME_DIR, resume_job


def resumable_files() -> list[str]:
    """The names of the server files a resumed job carries forward (round histories), of every registered part."""
    return sorted({f.name for f in server_files() if f.resume_arg is not None})


def history_rounds(result: Path, name: str) -> list[int] | None:
    """The rounds of the round history ``name`` that a job wrote into ``result`` (a downloaded result or a server
    run folder), in file order; None when it wrote none. The copy a resumed job starts from (``resume/``) is not
    the job's own. ValueError naming the file when it is not a history."""
    written = [f for f in sorted(Path(result).rglob(name)) if f.parent.name != RESUME_DIR]
    if not written:
        return None
    history = read_json_object(written[0]).get("history")
    if not isinstance(history, list):
        raise ValueError(f"{written[0]}: no round history (a JSON object with a list under 'history')")
    return [entry["round"] for entry in history]


def checksums(folders: list[Path]) -> dict[str, str]:
    """SHA-256 of every file under ``folders`` (logs excluded: NVFlare appends to them), by path."""
    sums = {}
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and not path.name.startswith("log") and path.suffix != ".log":
                sums[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return sums


def server_restart(r: Rehearsal, timeout: float) -> DrillOutcome:
    """Submit the rehearsal's job again, kill and restart the server after two rounds, resume the run as a new job
    and compare (see the module docstring); ``timeout``: seconds each job may take."""
    job_id = submit(r.poc, r.job)
    wait_for_rounds(r, job_id, 2, timeout)
    run_dir = r.server_run_dir(job_id)
    server_tree = process_tree(r.server_process)
    for proc in server_tree:
        send(proc, signal.SIGSTOP)
    done = rounds_completed(r, job_id)
    # the round histories the methods keep, which the resumed job must continue
    kept_histories = [name for name in resumable_files() if any(run_dir.rglob(name))]
    kept = [run_dir, *(p for p in r.job_store.iterdir() if p.is_dir() and p.name != job_id)]
    before = checksums(kept)
    for proc in server_tree:
        send(proc, signal.SIGKILL)
    psutil.wait_procs(server_tree, timeout=30)
    r.poc.processes.remove(r.server_process)
    r.server_process.wait(timeout=30)
    site_pids = {s: p.pid for s, p in r.site_processes.items()}
    since = server_log_size(r)
    restarted = time.monotonic()
    start_server(r)
    listening_s = round(time.monotonic() - restarted, 1)
    reconnect_s = wait_registered(r, list(r.site_processes), 300, since)
    same_sites = all(r.site_processes[s].pid == pid and r.site_processes[s].poll() is None
                     for s, pid in site_pids.items())
    after = checksums(kept)
    changed = sorted(f for f in before if after.get(f) != before[f])
    old_status = job_status(r, job_id)
    # What an operator does: write the resumed job from the run folder (it copies what it needs), then abort the
    # killed job so that the job store no longer lists it as running, then submit the resumed job.
    resumed, start_round, total = resume_job(r.job, run_dir, r.workspace / "resumed_job")
    admin(r.poc, ["abort", job_id, "--force"], 120, "job abort", check=False)
    aborted_status = job_status(r, job_id)
    second = submit(r.poc, resumed)
    status = wait(r.poc, second, timeout)
    result = r.workspace / "results" / second
    report = json.loads(download(r.poc, second, result).read_text()) if status == "FINISHED:COMPLETED" else {}
    rounds = [h["round"] for h in report.get("history", [])]
    histories = {name: history_rounds(result, name) if report else None for name in resumable_files()}
    # a history the killed job kept runs over every round of the two jobs; the resumed job starts none of its own
    histories_continue = all(found == list(range(total)) if name in kept_histories else found is None
                             for name, found in histories.items())
    figures = {"rounds_before_kill": done, "files_checked": len(before), "files_changed": changed,
               "server_listening_after_s": listening_s, "hospitals_registered_after_s": reconnect_s,
               "hospitals_restarted": [s for s, pid in site_pids.items() if r.site_processes[s].pid != pid],
               "killed_job_status_after_restart": old_status, "killed_job_status_after_abort": aborted_status,
               "resumed_job_status": status,
               "resumed_from_round": start_round, "total_rounds": total, "resumed_rounds": rounds,
               "killed_job_histories": kept_histories,
               "resumed_histories": {name: found for name, found in histories.items() if found is not None}}
    passed = (not changed and len(before) > 0 and same_sites and status == "FINISHED:COMPLETED"
              and start_round == done and rounds == list(range(start_round, total)) and histories_continue)
    detail = (f"server killed after {done} rounds; {len(before)} files checked, "
              + (f"CHANGED: {changed}" if changed else "all unchanged")
              + f"; new server listening after {listening_s} s, hospitals back without restart after "
              + ", ".join(f"{s} {t} s" for s, t in reconnect_s.items())
              + f"; killed job listed as {old_status} ({aborted_status} after `nvflare job abort`); resumed job "
              + f"({status}) trained rounds "
              + (f"{rounds[0]}-{rounds[-1]}" if rounds else "none")
              + "".join(f", {name} rounds {found[0]}-{found[-1]}" if found else f", {name} EMPTY"
                        for name, found in histories.items() if found is not None))
    return DrillOutcome("server-restart", passed, figures, detail)
