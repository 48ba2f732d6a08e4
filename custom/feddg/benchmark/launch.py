"""Launching one NVFlare simulator run: the one place that starts ``feddg simulate`` for the benchmark tools.

Used by the sweep's local executor (several at once, :mod:`feddg.benchmark.executors.local`), the Ray worker
(:mod:`feddg.benchmark.executors.ray_cluster`) and ``benchmarks/round_time.py``. A :class:`SimulatorRun` is

* the command: ``python -m feddg.cli simulate JOB -w WORKSPACE -- SIMULATOR_ARGS`` (:func:`simulate_command`),
  with ``-gpu G`` added when the run is given a GPU;
* its environment: the caller's, with :data:`~feddg.compute.CONCURRENT_RUNS_ENV` set to the number of runs that
  share this host, so that ``feddg simulate`` counts every site process on the host in the thread budget
  (:mod:`feddg.compute`);
* its own session (``start_new_session``), its output to a log file;
* supervision without blocking (:meth:`SimulatorRun.poll`): its end, its rounds (``feddg_progress.json``), its
  time limit; and :meth:`SimulatorRun.stop`, which kills it with every process it started, the site workers in
  sessions of their own included (:func:`feddg.process_tree.kill_tree`).

:func:`run_simulator` runs one to its end, blocking, for callers with one run at a time.

NVFlare 2.9's simulator picks a free port, frees it, and has a site's worker process bind it; another process on the
host can take it in between. The worker then fails (:data:`PORT_RACE` in the log) and the simulator never ends: it
talks to whatever listens on that port and waits for an answer (measured: NVFlare's trivial job with the port taken,
the line 6 s into the run, and the run still waiting when stopped at 120 s). So :meth:`SimulatorRun.poll` stops a run
as soon as its log shows the line, and such a run may be started once more (:meth:`SimulatorRun.may_start_again`):
by :func:`run_simulator` itself, and by the local executor in its own loop. Any other failure is the run's own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from feddg.compute import CONCURRENT_RUNS_ENV
from feddg.flare.constants import PROGRESS_FILE, SIMULATOR_JOB
from feddg.jsonfile import read_json

SERVER_RUN = Path("server") / SIMULATOR_JOB  # the server's run folder in a simulator workspace
POLL_S = 0.5  # how often a waiting caller looks at its runs (their end, rounds, a signal, their time)
KILL_WAIT_S = 20.0  # how long a stopped run's processes may take to be gone
STOP_GRACE_S = 1.0  # on a stop signal, how long a run may take to end by itself (one writing its last files)
PORT_RACE = "Address already in use"  # a site worker's bind failed: the port race (the module docstring)
MAX_ATTEMPTS = 2  # a run that lost the port race is started once more, no more


def simulate_command(job: Path, workspace: Path, simulator_args: Sequence[str]) -> list[str]:
    """The command that runs one job: ``feddg simulate`` with the simulator flags after ``--``."""
    return [sys.executable, "-m", "feddg.cli", "simulate", str(job), "-w", str(workspace), "--", *simulator_args]


def with_gpu(simulator_args: Sequence[str], gpu: str | None) -> list[str]:
    """``simulator_args`` with ``-gpu gpu`` added (every site of the run on that GPU); unchanged for None."""
    return [*simulator_args, "-gpu", gpu] if gpu is not None else list(simulator_args)


@dataclass(frozen=True)
class Ended:
    """How a run ended: ``ok`` (by itself; its exit code says how), ``timeout``, ``interrupted``, or ``failed``
    (stopped on losing the port race); ``attempts``: the times it was started."""

    status: str
    reason: str
    returncode: int | None
    wall_s: float
    attempts: int = 1


class SimulatorRun:
    """One ``feddg simulate`` run in a session of its own (see the module docstring).

    Args:
        job: the job folder.
        workspace: the simulator's workspace (the server's run files end in ``workspace / SERVER_RUN``).
        log: the file its stdout and stderr go to (truncated at start).
        simulator_args: ``nvflare simulator`` flags.
        gpu: the GPU the run's sites use (``-gpu``), or None (CPU, or the flags' own choice).
        concurrent_runs: the runs sharing this host's cores at once (this one included).
        env: extra environment variables of the run.
        command: the command to run instead of ``feddg simulate``'s (an NVFlare job that is not ours, e.g. the
            round-time anchors); ``simulator_args`` and ``gpu`` are then the command's business.
    """

    def __init__(self, job: Path, workspace: Path, log: Path, simulator_args: Sequence[str] = (),
                 gpu: str | None = None, concurrent_runs: int = 1, env: Mapping[str, str] | None = None,
                 command: Sequence[str] | None = None) -> None:
        self.job, self.workspace, self.log = Path(job), Path(workspace), Path(log)
        self.command = (list(command) if command is not None else
                        simulate_command(self.job, self.workspace, with_gpu(simulator_args, gpu)))
        self.env = {**os.environ, CONCURRENT_RUNS_ENV: str(concurrent_runs), **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.started = 0.0
        self.attempts = 0  # the times it was started
        self._scanned, self._lost_port = 0, False  # the log's bytes searched for PORT_RACE so far; whether found
        self._own_workspace = False  # the workspace did not exist at the first start: this run made it

    @property
    def server_dir(self) -> Path:
        return self.workspace / SERVER_RUN

    @property
    def wall_s(self) -> float:
        return time.perf_counter() - self.started if self.proc is not None else 0.0

    def start(self) -> SimulatorRun:
        if self.attempts == 0:
            self._own_workspace = not self.workspace.exists()
        self.attempts += 1
        self._scanned, self._lost_port = 0, False
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w") as f:
            self.proc = subprocess.Popen(self.command, stdout=f, stderr=subprocess.STDOUT, env=self.env,
                                         start_new_session=True)
        self.started = time.perf_counter()
        return self

    def rounds_done(self) -> int | None:
        """The rounds the server has finished (its ``feddg_progress.json``), None before the first."""
        return read_json(self.server_dir / PROGRESS_FILE).get("rounds_completed")

    def poll(self, timeout: float) -> Ended | None:
        """None while it runs within ``timeout`` seconds; its end when it ended by itself, or ``timeout`` after it
        was stopped (:meth:`stop`) for running past ``timeout``."""
        assert self.proc is not None, "start() first"
        if self.proc.poll() is not None:
            return Ended("ok", "", self.proc.returncode, self.wall_s, self.attempts)
        if self.lost_a_port():
            return self.stop("failed", f"the simulator lost a port to another process ({PORT_RACE}); stopped after "
                                       f"{self.wall_s:.0f} s")
        if self.wall_s > timeout:
            return self.stop("timeout", f"stopped after {timeout:.0f} s")
        return None

    def ended_within(self, seconds: float) -> Ended | None:
        """Its end when it ends by itself within ``seconds``; None when it still runs then."""
        assert self.proc is not None, "start() first"
        try:
            self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return None
        return Ended("ok", "", self.proc.returncode, self.wall_s, self.attempts)

    def stop(self, status: str, reason: str) -> Ended:
        """Kill it with every process it started and reap it; ``reason`` gets a note naming processes still there
        :data:`KILL_WAIT_S` seconds after SIGKILL, if any."""
        from feddg.process_tree import kill_tree

        assert self.proc is not None, "start() first"
        wall = self.wall_s
        left, _ = kill_tree(self.proc.pid, KILL_WAIT_S)
        try:
            self.proc.wait(timeout=KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            left = [self.proc.pid, *left]
        stuck = f"; process(es) {left} still there {KILL_WAIT_S:.0f} s after SIGKILL" if left else ""
        return Ended(status, reason + stuck, self.proc.returncode, wall, self.attempts)

    def lost_a_port(self) -> bool:
        """Whether its log shows the simulator's port race (:data:`PORT_RACE`) since it was last started. Reads only
        what the log gained since the last call (a long run's log is large, and this is asked at every poll)."""
        if not self._lost_port and self.log.exists():
            with open(self.log, "rb") as f:
                offset = max(0, self._scanned - len(PORT_RACE) + 1)  # the line may have come in two writes
                f.seek(offset)
                new = f.read()
            self._scanned = offset + len(new)
            self._lost_port = PORT_RACE.encode() in new
        return self._lost_port

    def may_start_again(self, ended: Ended) -> bool:
        """Whether a run that ended so is started once more (:meth:`start_again`): it lost the port race (the
        module docstring) and has not been started :data:`MAX_ATTEMPTS` times."""
        failed = ended.status != "interrupted" and (ended.status != "ok" or ended.returncode != 0)
        return failed and self.attempts < MAX_ATTEMPTS and self.lost_a_port()

    def start_again(self) -> SimulatorRun:
        """Start it once more after it ended: its workspace is removed first when this run made it (the callers hand
        it a fresh one), its log truncated."""
        assert self.proc is not None and self.proc.poll() is not None, "a run is started again after it ended"
        if self._own_workspace:
            shutil.rmtree(self.workspace, ignore_errors=True)
        return self.start()


def run_simulator(run: SimulatorRun, timeout: float, label: str = "", rounds: int | None = None,
                  report: Callable[[str], None] | None = None,
                  stop_requested: Callable[[], str | None] = lambda: None) -> Ended:
    """Start ``run`` and wait for its end (at most ``timeout`` seconds, then it is stopped), reporting its rounds
    (``label: k/rounds rounds after s``) when ``report`` is given; ``stop_requested()`` returning a reason stops
    it as ``interrupted``. Every way out (an exception included) leaves none of its processes behind."""
    run.start()
    last, ended = None, None
    try:
        while ended is None:
            why = stop_requested()
            if why is not None:
                ended = run.stop("interrupted", why)
                break
            ended = run.poll(timeout)
            if ended is not None and run.may_start_again(ended):
                if report is not None:
                    report(f"    {label}: {ended.reason}; starting it again")
                run.start_again()
                ended = None
            done = run.rounds_done()
            if report is not None and done != last:
                report(f"    {label}: {done or 0}/{rounds} rounds after {run.wall_s:.0f} s")
                last = done
            if ended is None:
                time.sleep(POLL_S)
    finally:
        if ended is None:
            run.stop("interrupted", "the caller stopped waiting")
    return ended
