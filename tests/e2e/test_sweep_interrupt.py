"""Ctrl-C during a real sweep run: every process the sweep started (the simulator, and its site workers in sessions
of their own) is gone within 30 s, the run is recorded as interrupted (never half-written), and the same command
then completes the sweep."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.e2e.test_benchmark import TINY
from tests.conftest import REPOSITORY

pytestmark = pytest.mark.slow

SWEEP = [sys.executable, "-m", "feddg.cli", "benchmark", "--task", "fundus", "--methods", "fedavg", "--held-out",
         "Domain1", "--seeds", "0-1", "--resamples", "200", "--run-timeout", "600", *TINY]
RUNS = ["fundus_fedavg_Domain1_seed0", "fundus_fedavg_Domain1_seed1"]


def _tree(pid: int) -> dict[int, tuple[int, float]]:
    """Process id -> (session id, start time) of ``pid`` and every process below it (those that exist now)."""
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    found = {}
    for proc in procs:
        try:
            found[proc.pid] = (os.getsid(proc.pid), proc.create_time())
        except (OSError, psutil.NoSuchProcess):
            continue
    return found


def _left(seen: dict[int, tuple[int, float]], since: float, folder: Path) -> list[int]:
    """The processes still running that the sweep started: one seen in its tree (the same process: its start time
    checked), or one started since ``since`` in a session of one (a worker re-parented to init keeps its session)
    or naming ``folder`` in its command line (a worker started after the last look at the tree)."""
    sessions = {sid for sid, _ in seen.values()} - {os.getsid(0)}
    left = []
    for proc in psutil.process_iter(["pid", "status", "create_time", "cmdline"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            started = proc.info["create_time"]
            ours = started >= since and (os.getsid(proc.pid) in sessions
                                         or str(folder) in " ".join(proc.info["cmdline"] or []))
            if seen.get(proc.pid, (None, None))[1] == started or ours:
                left.append(proc.pid)
        except (OSError, psutil.NoSuchProcess):
            continue
    return left


def _wait(condition, timeout: float, step: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(step)
    return condition()


def test_sigint_stops_every_process_of_the_run_records_it_and_a_resume_completes_the_sweep(tmp_path):
    env = {**os.environ, "FEDDG_CACHE": str(tmp_path / "cache")}
    out = tmp_path / "results"
    seen: dict[int, tuple[int, float]] = {}
    since = time.time() - 1
    with open(tmp_path / "sweep.log", "w") as log:
        sweep = subprocess.Popen([*SWEEP, "--out", str(out)], stdout=log, stderr=subprocess.STDOUT, env=env,
                                 cwd=REPOSITORY, start_new_session=True)
    try:
        def workers_running() -> bool:  # every site's worker (fundus: 4 sites), their rounds begun
            seen.update(_tree(sweep.pid))
            return sum("simulator_worker" in " ".join(_cmdline(pid)) for pid in _tree(sweep.pid)) == 4

        assert _wait(workers_running, 300, 0.2), "the first run's four site workers did not start within 300 s"
        time.sleep(2)  # into the first round
        seen.update(_tree(sweep.pid))
        sessions = {sid for sid, _ in seen.values()}
        assert len(sessions) >= 3, f"the sweep, the simulator and its workers, each a session of its own: {seen}"
        sent = time.monotonic()
        sweep.send_signal(signal.SIGINT)
        gone = _wait(lambda: not _left(seen, since, out), 30, 0.05)
        gone_s = time.monotonic() - sent
        code = sweep.wait(timeout=30)
        exit_s = time.monotonic() - sent
    finally:
        for pid in _left(seen, since, out):  # never leave a process behind, even when the test fails
            os.kill(pid, signal.SIGKILL)
        if sweep.poll() is None:
            sweep.kill()
    print(f"\ninterrupt timings: SIGINT to the sweep's exit {exit_s:.2f} s, to its last process gone {gone_s:.2f} s "
          f"({len(seen)} processes in {len(sessions)} sessions)")
    text = (tmp_path / "sweep.log").read_text()
    assert gone and gone_s < 30, f"processes left 30 s after SIGINT: {_left(seen, since, out)}"
    assert code == 130, text[-3000:]
    assert text.strip().splitlines()[-1] == (f"feddg benchmark: interrupted by SIGINT: {RUNS[0]} was stopped with "
                                             f"every process it started and recorded as interrupted (the same "
                                             f"command runs it again)"), "one line, no traceback"
    assert "Traceback" not in text
    record = json.loads((out / "runs" / RUNS[0] / "run.json").read_text())
    assert record["status"] == "interrupted" and record["reason"].startswith("stopped by SIGINT after")
    assert not (out / "runs" / RUNS[1]).exists() and not (out / ".sweep.lock").exists()

    resumed = subprocess.run([*SWEEP, "--out", str(out)], capture_output=True, text=True, env=env, cwd=REPOSITORY,
                             timeout=900)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "2 runs, 0 done before, 2 to run" in resumed.stdout, "the interrupted run is run again"
    for run_id in RUNS:
        assert json.loads((out / "runs" / run_id / "run.json").read_text())["status"] == "ok"


def _cmdline(pid: int) -> list[str]:
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []
