"""A multi-site rehearsal on one machine: NVFlare's POC mode with the consortium's real project and site policy.

    feddg poc JOB --workspace /tmp/feddg/poc [--timeout 1800]

1. ``nvflare poc prepare -i <project.yml>`` with the task's consortium project (:mod:`feddg.provisioning`): the
   server, every hospital of the job, the project admin, a lead and a member per hospital, signed kits.
2. The project's site policy goes into every kit (:func:`feddg.flare.site_policy.install_site_policy`):
   allow-list, privacy scope with the site egress filter, authorization (only leads submit, no custom code).
3. The server and every hospital start, each as one process this command starts and owns (``sub_start.sh --once``).
4. A hospital lead submits the job with ``nvflare job submit``, the command waits for it with a bound
   (``nvflare job wait --timeout``), downloads the result (``nvflare job download``) and prints the metrics table
   of the job's ``feddg_report.json``.
5. Everything it started is stopped by process id (with the processes those started), on success, on failure and
   on Ctrl-C.

The admin commands run with ``HOME`` inside the workspace, so the user's own ``~/.nvflare`` is left alone.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import yaml

from feddg.compute import SITE_PROCESSES_ENV
from feddg.experiment import load_experiment
from feddg.flare.constants import CONFIG_FILE
from feddg.flare.site_policy import install_site_policy
from feddg.folders import claim, guard_folder
from feddg.numbers import seconds
from feddg.numerics import cpu_pin_mode, pinned_environment
from feddg.provisioning import FED_LEARN_PORT, hospital_admins, project
from feddg.report import REPORT_FILE, format_table


class RehearsalError(RuntimeError):
    """The rehearsal could not finish; the message says at which step and why."""


@dataclass
class POC:
    """A prepared POC: where its kits are and the processes this object started."""

    workspace: Path
    prod: Path
    server: str
    clients: list[str]
    lead: str
    processes: list[subprocess.Popen] = field(default_factory=list)
    # participant -> the argv prefix that puts its programs in its own network stack (`feddg rehearse-network`);
    # empty in a POC, where every participant shares this machine's stack.
    prefixes: dict[str, list[str]] = field(default_factory=dict)

    def argv(self, participant: str, cmd: list[str]) -> list[str]:
        return [*self.prefixes.get(participant, []), *cmd]

    @property
    def env(self) -> dict[str, str]:
        home = self.workspace / "home"
        home.mkdir(parents=True, exist_ok=True)
        return {**pinned_environ(), "HOME": str(home), "NVFLARE_POC_WORKSPACE": str(self.workspace / "nvflare_poc")}

    def kit(self, name: str) -> Path:
        return self.prod / name


def pinned_environ() -> dict[str, str]:
    """This process's environment with ``FEDDG_CPU_PIN`` (:mod:`feddg.numerics`) turned into the variables that pin
    the kernels: what every participant, admin command and job process of a POC starts with."""
    return {**os.environ, **pinned_environment(cpu_pin_mode())}


def prepare(workspace: Path, task: str, sites: list[str]) -> POC:
    """``nvflare poc prepare`` with the consortium's project restricted to the job's sites, then the site policy."""
    workspace = guard_folder(workspace, "--workspace")  # cleared below: a folder of ours only
    if workspace.exists():
        shutil.rmtree(workspace)
    claim(workspace, "feddg poc --workspace")
    spec = project(task, server="localhost", sites=sites)
    project_file = workspace / "project.yml"
    project_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    poc = POC(workspace, workspace / "nvflare_poc" / spec["name"] / "prod_00", "localhost", list(sites),
              hospital_admins(sites[0])["lead"])
    _run(["nvflare", "poc", "prepare", "-i", str(project_file), "--force"], poc.env, 180, "poc prepare")
    if not poc.prod.is_dir():
        raise RehearsalError(f"poc prepare: no kits under {poc.prod}")
    install_site_policy(poc.prod)
    return poc


def start(poc: POC, ready_timeout: float = 120) -> None:
    """Start the server, wait until it listens, then every hospital; each one process of ours."""
    with socket.socket() as s:
        if s.connect_ex(("localhost", FED_LEARN_PORT)) == 0:
            raise RehearsalError(f"port {FED_LEARN_PORT} is in use: another FLARE server (a POC?) is running here")
    env = pinned_environ()
    poc.processes.append(start_participant(poc.kit(poc.server), poc.workspace / "logs" / "server.log", env))
    _wait_for_port("localhost", FED_LEARN_PORT, ready_timeout, poc)
    # Every hospital runs on this one host: each job process takes its share of the cores (feddg.compute).
    site_env = {**env, SITE_PROCESSES_ENV: str(len(poc.clients))}
    for site in poc.clients:
        poc.processes.append(start_participant(poc.kit(site), poc.workspace / "logs" / f"{site}.log", site_env))
    time.sleep(5)  # let the clients register before a job is scheduled
    for proc in poc.processes:
        if proc.poll() is not None:
            raise RehearsalError(f"a POC process exited at start (code {proc.returncode}); see "
                                 f"{poc.workspace / 'logs'}")


def start_participant(kit: Path, log: Path, env: dict[str, str] | None = None, prefix: list[str] | None = None
                      ) -> subprocess.Popen:
    """Start one participant (the server or a hospital) from its startup kit, as a process the caller owns.

    It runs NVFlare's ``startup/sub_start.sh --once`` (the kit's start script without its restart loop) in ``kit``,
    in a session of its own, its output and errors appended to ``log`` (folders created). ``env``: its environment
    (default: this process's); ``prefix``: an argv that runs it elsewhere, e.g. ``ip netns exec <namespace>`` for the
    network rehearsal's namespaces. The caller stops it, and the processes it starts, with :func:`stop_processes`.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as out:  # the child keeps its own descriptor
        return subprocess.Popen([*(prefix or []), "bash", str(kit / "startup" / "sub_start.sh"), "--once"], cwd=kit,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)


def _wait_for_port(host: str, port: int, timeout: float, poc: POC) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if poc.processes and poc.processes[0].poll() is not None:
            raise RehearsalError(f"the server exited at start; see {poc.workspace / 'logs' / 'server.log'}")
        with socket.socket() as s:
            s.settimeout(1)
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(1)
    raise RehearsalError(f"the server did not listen on {host}:{port} within {timeout:.0f} s")


def stop(poc: POC) -> None:
    """Stop every process this POC started, and their descendants, by process id."""
    stop_processes(poc.processes)
    poc.processes.clear()


def stop_processes(processes: list[subprocess.Popen]) -> None:
    """SIGTERM ``processes`` and their descendants, SIGKILL what is left after 10 s, reap them."""
    victims: list[psutil.Process] = []
    for proc in processes:
        try:
            parent = psutil.Process(proc.pid)
            victims += [parent, *parent.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    for p in victims:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(victims, timeout=10)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=10)
    for proc in processes:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def admin(poc: POC, args: list[str], timeout: float, step: str, user: str | None = None, check: bool = True) -> str:
    """Run an ``nvflare job ...`` command as ``user`` (default: the first hospital's lead) and return its output."""
    user = user or poc.lead
    return _run(poc.argv(user, ["nvflare", "job", *args, "--startup-kit", str(poc.kit(user))]), poc.env, timeout,
                step, check)


def submit(poc: POC, job: Path, user: str | None = None) -> str:
    out = admin(poc, ["submit", "-j", str(job)], 300, "job submit", user)
    match = re.search(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", out)
    if not match:
        raise RehearsalError(f"job submit: no job id in the output:\n{out[-2000:]}")
    return match.group(0)


def wait(poc: POC, job_id: str, timeout: float) -> str:
    """Wait for the job to end (at most ``timeout`` s); returns its final status, e.g. ``FINISHED:COMPLETED``.

    Raises:
        RehearsalError: the job was still running after ``timeout``.
    """
    out = admin(poc, ["wait", job_id, "--timeout", str(int(timeout))], timeout + 120, "job wait", check=False)
    match = re.search(r"status:.*?\b(FINISHED:[A-Z_]+)", out)
    if not match:
        raise RehearsalError(f"job wait: job {job_id} did not finish within {timeout:.0f} s:\n{out[-2000:]}")
    return match.group(1)


def fetch(poc: POC, job_id: str, out_dir: Path) -> None:
    """``nvflare job download`` of the job's result (server workspace and logs) into ``out_dir``."""
    admin(poc, ["download", job_id, "-o", str(out_dir), "--force"], 600, "job download")


def download(poc: POC, job_id: str, out_dir: Path) -> Path:
    """The job's result in ``out_dir``; returns its report (RehearsalError when it has none)."""
    fetch(poc, job_id, out_dir)
    reports = sorted(Path(out_dir).rglob(REPORT_FILE))
    if not reports:
        raise RehearsalError(f"job download: no {REPORT_FILE} in {out_dir} (the job did not finish its evaluation; "
                             f"see {poc.workspace / 'logs'})")
    return reports[0]


def server_errors(poc: POC, job_id: str, out_dir: Path, limit: int = 30) -> str:
    """The ERROR lines (and tracebacks) of the server's log of a finished job, downloaded into ``out_dir``: what a
    status other than ``FINISHED:COMPLETED`` needs to be understood without opening the POC's folders."""
    try:
        fetch(poc, job_id, out_dir)
    except RehearsalError as e:
        return f"(the job's logs could not be downloaded: {e})"
    logs = sorted(Path(out_dir).rglob("workspace/log.txt"))
    if not logs:
        return f"(no server log in the download of job {job_id} at {out_dir})"
    lines = [line for line in logs[0].read_text(errors="replace").splitlines()
             if " ERROR " in line or " CRITICAL " in line or "Traceback" in line or "Error:" in line]
    return "\n".join(lines[-limit:]) or f"(no ERROR line in {logs[0]})"


def _run(cmd: list[str], env: dict[str, str], timeout: float, step: str, check: bool = True) -> str:
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise RehearsalError(f"{step}: no answer within {timeout:.0f} s") from e
    out = proc.stdout + proc.stderr
    if check and proc.returncode != 0:
        raise RehearsalError(f"{step} failed (exit {proc.returncode}):\n{out[-3000:]}")
    return out


def rehearse(job: Path, workspace: Path, timeout: float = 1800) -> dict:
    """Prepare, start, submit ``job``, wait, download, print the table, stop. Returns the job's report."""
    job = Path(job).resolve()
    cfg = load_experiment(job / "app" / "config" / CONFIG_FILE)
    poc = prepare(workspace, cfg.data.task, cfg.data.sites)
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        start(poc)
        print(f"POC up: server + {poc.clients}; {poc.lead} submits {job.name}", flush=True)
        job_id = submit(poc, job)
        print(f"job {job_id} submitted; waiting up to {timeout:.0f} s", flush=True)
        status = wait(poc, job_id, timeout)
        if status != "FINISHED:COMPLETED":
            errors = server_errors(poc, job_id, poc.workspace / "results" / job_id)
            raise RehearsalError(f"job {job_id} ended with {status}; the server's errors:\n{errors}\n(logs: "
                                 f"{poc.workspace / 'results' / job_id}, sites: {poc.workspace / 'logs'})")
        report_path = download(poc, job_id, poc.workspace / "results" / job_id)
        report = json.loads(report_path.read_text())
        print(f"\n{job.name} in the POC, unseen site {report['unseen_site']} (report: {report_path})\n"
              f"{format_table(report['table'])}\n", flush=True)
        return report
    finally:
        stop(poc)
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="feddg poc", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("job", help="a job folder, e.g. jobs/prostate_fedavg")
    parser.add_argument("--workspace", default="/tmp/feddg/poc", help="POC folder (deleted and recreated)")
    parser.add_argument("--timeout", type=seconds, default=3600, help="seconds to wait for the job")
    args = parser.parse_args(argv)
    try:
        if not args.timeout > 0 or not math.isfinite(args.timeout):
            raise ValueError(f"--timeout {args.timeout:g}: give a positive, finite number of seconds")
        guard_folder(args.workspace, "--workspace", inputs=[args.job])  # before anything is made or started
    except ValueError as e:
        print(f"feddg poc: error: {e}", file=sys.stderr)
        return 2
    try:
        rehearse(Path(args.job), Path(args.workspace), args.timeout)
    except RehearsalError as e:
        print(f"POC rehearsal failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("POC rehearsal interrupted; everything it started is stopped", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
