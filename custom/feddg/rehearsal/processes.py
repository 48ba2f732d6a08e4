"""The rehearsal's processes and what it reads of them: the server and the hospitals started from their kits in
their own namespaces, their registrations, a job's rounds and status, and the server's log.

Every process is started with :func:`feddg.poc.start_participant` and recorded in ``r.poc.processes``, so that
:func:`feddg.poc.stop` stops it (and what it started) by process id, whatever ends the rehearsal.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import psutil

from feddg.compute import SITE_PROCESSES_ENV
from feddg.flare.constants import PROGRESS_FILE
from feddg.poc import RehearsalError, admin, start_participant
from feddg.provisioning import ADMIN_PORT, FED_LEARN_PORT
from feddg.rehearsal.consortium import ADMINS, SERVER_NAME, Rehearsal


def start_server(r: Rehearsal, ready_timeout: float = 120) -> None:
    """Start the server from its kit in its namespace; return once the admins' namespace reaches both of its ports
    (RehearsalError if it exits first or is not listening within ``ready_timeout`` s)."""
    r.server_process = start_participant(r.poc.kit(SERVER_NAME), r.log("server"), prefix=r.net.prefix(SERVER_NAME))
    r.poc.processes.append(r.server_process)
    deadline = time.monotonic() + ready_timeout
    while not (r.net.can_reach(ADMINS, SERVER_NAME, FED_LEARN_PORT)
               and r.net.can_reach(ADMINS, SERVER_NAME, ADMIN_PORT)):
        if r.server_process.poll() is not None:
            raise RehearsalError(f"the server exited at start (code {r.server_process.returncode}); see "
                                 f"{r.log('server')}")
        if time.monotonic() > deadline:
            raise RehearsalError(f"the server did not listen at {SERVER_NAME} within {ready_timeout:.0f} s")
        time.sleep(1)


def start_sites(r: Rehearsal) -> None:
    """Start every hospital from its kit in its namespace; return once the server has registered them all."""
    # One machine plays every host: each hospital's job process takes its share of the cores (feddg.compute).
    env = {**os.environ, SITE_PROCESSES_ENV: str(len(r.poc.clients))}
    for site in r.poc.clients:
        r.site_processes[site] = start_participant(r.poc.kit(site), r.log(site), env, prefix=r.net.prefix(site))
        r.poc.processes.append(r.site_processes[site])
    wait_registered(r, r.poc.clients, 120)


def wait_registered(r: Rehearsal, sites: list[str], timeout: float, since: int = 0) -> dict[str, float]:
    """Until the server's log, from byte ``since`` on, has each site's registration ("New client <site>@... joined",
    or "Re-activate the client: <site>" where the server still knew the hospital's token: a link back up; the
    address there is what the client says of itself, not the connection's: its namespace lets it reach the server
    only over the test network). Returns the seconds each one took; RehearsalError naming the sites missing after
    ``timeout`` s, or a site whose process exited."""
    started = time.monotonic()
    took: dict[str, float] = {}
    while time.monotonic() - started < timeout:
        text = server_log_since(r, since)
        for site in sites:
            if site not in took and (f"New client {site}@" in text or f"Re-activate the client: {site} " in text):
                took[site] = round(time.monotonic() - started, 1)
        if len(took) == len(sites):
            return took
        for site in sites:
            if r.site_processes[site].poll() is not None:
                raise RehearsalError(f"{site} exited; see {r.log(site)}")
        time.sleep(0.5)
    raise RehearsalError(f"{sorted(set(sites) - set(took))} did not register with the server within {timeout:.0f} s; "
                         f"see {r.server_log}")


def restore_links(r: Rehearsal) -> dict[str, float]:
    """Bring back the links a drill left down, and wait for those hospitals to register again (seconds each)."""
    if not r.cut:
        return {}
    since = server_log_size(r)
    for site in sorted(r.cut):
        r.net.link(site, up=True)
    took = wait_registered(r, sorted(r.cut), 300, since)
    r.cut.clear()
    return took


def rounds_completed(r: Rehearsal, job_id: str) -> int:
    """The rounds the job's workflow reports done (its progress file in the server's run folder; 0 before any)."""
    try:
        return int(json.loads((r.server_run_dir(job_id) / PROGRESS_FILE).read_text())["rounds_completed"])
    except (OSError, ValueError, KeyError):
        return 0


def wait_for_rounds(r: Rehearsal, job_id: str, rounds: int, timeout: float) -> None:
    """Until the job has completed ``rounds`` rounds; RehearsalError if it ended before, or after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while rounds_completed(r, job_id) < rounds:
        if (r.job_store / job_id / "workspace").exists():  # the server stored the finished job's result
            raise RehearsalError(f"job {job_id} ended before {rounds} rounds were completed")
        if time.monotonic() > deadline:
            raise RehearsalError(f"job {job_id}: fewer than {rounds} rounds after {timeout:.0f} s")
        time.sleep(0.2)


def job_status(r: Rehearsal, job_id: str) -> str:
    """The job's status as ``nvflare job list`` shows it to the lead ("not listed" when it does not)."""
    out = admin(r.poc, ["list"], 120, "job list", check=False)
    for line in out.splitlines():
        if job_id in line:
            found = re.search(r"\b(FINISHED:[A-Z_]+|RUNNING|SUBMITTED|DISPATCHED|ABANDONED)\b", line)
            if found:
                return found.group(1)
    return "not listed"


def process_tree(proc: subprocess.Popen) -> list[psutil.Process]:
    """``proc`` and every process under it (empty once it is gone)."""
    try:
        parent = psutil.Process(proc.pid)
        return [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def log_size(log: Path) -> int:
    """A log's size now: the offset a later read starts from, to see only what follows."""
    return log.stat().st_size if log.exists() else 0


def server_log_size(r: Rehearsal) -> int:
    return log_size(r.server_log)


def server_log_since(r: Rehearsal, offset: int) -> str:
    return read_since(r.server_log, offset)


def read_since(log: Path, offset: int) -> str:
    """The text of ``log`` from byte ``offset`` on (all of it when the log was rotated or restarted since)."""
    if not log.exists():
        return ""
    with open(log, errors="replace") as f:
        if offset > os.path.getsize(log):
            offset = 0
        f.seek(offset)
        return f.read()


def wait_for_line(log: Path, needles: tuple[str, ...], timeout: float, since: int = 0, poll: float = 1.0) -> str:
    """The text of ``log`` from byte ``since`` on, once it holds one of ``needles`` (read every ``poll`` s); empty if
    none within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = read_since(log, since)
        if any(n in text for n in needles):
            return text
        time.sleep(poll)
    return ""
