"""``--executor flare --kit ADMIN_KIT``: each cell a job of the consortium's own NVFlare deployment.

A hospital lead runs the sweep from a machine with their admin startup kit. Each cell's rendered job folder is
submitted through the FLARE API (:class:`nvflare.fuel.flare_api.flare_api.Session`, the same admin protocol as
``nvflare job submit``), at most ``--max-jobs`` of the sweep's jobs in the deployment at once; the server's job
scheduler runs them side by side as far as its own ``max_jobs`` and each site's resources allow (the job's
``resource_spec`` asks every site for ``--site-gpus`` GPUs with ``--site-gpu-mem`` GiB each; 0 GPUs on CPU sites).
The sweep waits for each job (its time limit counted from when the deployment starts it, not while it queues),
downloads the result (the server's run folder: ``feddg_report.json`` and the files the sweep keeps) and hands it to
the sweep as an :class:`~feddg.benchmark.executors.base.Outcome`, from which the sweep writes the same ``run.json``
as for a simulator run, with ``executor`` naming the server, the job id and the sites.

What travels to the deployment is the job folder and nothing else: no code (the sites run their installed
``feddg`` package under the project's site policy) and no data path. On real data the submitted ``feddg.yaml``
names no folder (:data:`feddg.flare.site_config.AT_EACH_SITE`): each hospital reads its own data from the
``data_root`` of its own ``local/feddg_site.json``, so no hospital's path reaches the others. The sweep's
``--data-root DIR --layout L`` then only says "real data in layout L": DIR is recorded with the results folder's
protocol, and neither read on this host (:attr:`FlareExecutor.data_here`; each hospital checks its own data with
``feddg check-data``) nor sent. The held-out hospital is a site of every job, and the job's workflow only asks it
to evaluate.

Refused before any submission, in one line (:class:`~feddg.benchmark.executors.base.ExecutorError`): a ``--kit``
that is not an admin kit (a site's or the server's kit, or no kit) or is the kit of a role the project's
authorization does not let submit (only leads submit: :func:`feddg.flare.site_policy.authorization`); a server
that does not answer within ``--connect-timeout``; a site of the sweep's jobs that is not a connected client of the
deployment.

A run that did not end by itself leaves no result, and the next sweep runs it again: a stop signal (Ctrl-C,
SIGTERM) aborts every job of the sweep that has not ended and reports those cells ``interrupted``. A server that
stops answering is waited for (``--reconnect-timeout``, logging in again); when it comes back with a new start
time it has restarted, and a job of the sweep that was dispatched or running then is aborted and reported
``interrupted`` (NVFlare 2.9 resumes no job after a server restart; its status would stay RUNNING), while one still
queued is left to the restarted scheduler. If the server does not come back, every running cell is reported
``interrupted`` and no other is submitted. A job the deployment ends with another status than
``FINISHED:COMPLETED`` is the run's failure, with the server's last error line. The cell's log
(``OUT/runs/<id>/simulate.log``) holds the job's submission and status changes, then the server's log of the job.

Why one module: one executor is one module (``executors/``: the seam in base.py, one module each); this one's
length is the deployment's failure cases above, each handled where the job's state is.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import yaml

from feddg.benchmark.executors.base import (FAILED, INTERRUPTED, OK, TIMEOUT, Cell, CellExecutor, ExecutorError, OnDone,
                                            Outcome, Report)
from feddg.benchmark.signals import STOP_SIGNALS
from feddg.numbers import non_negative, seconds

ADMIN_CONFIG = Path("startup") / "fed_admin.json"  # what makes a folder an admin startup kit
OTHER_KITS = {"fed_client.json": "a site's (client) startup kit", "fed_server.json": "the server's startup kit"}
ROLE_OID = "1.2.840.113549.1.9.2"  # unstructuredName: NVFlare's provisioner writes an admin's role there
COMPLETED = "FINISHED:COMPLETED"
QUEUED = ("SUBMITTED", "APPROVED")  # a job's statuses before the scheduler dispatches it
POLL_S = 2.0  # how often each job's status is asked for
ABORT_WAIT_S = 60.0  # how long aborted jobs may take to end before the sweep stops waiting for them
RESULT_DIR = "flare"  # OUT/runs/<id>/flare: the submitted copy of the job and the downloaded result (scratch)

T = TypeVar("T")


# ------------------------------------------------------------------------------------------------- the options


def add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--kit", metavar="ADMIN_KIT",
                       help="flare: a hospital lead's admin startup kit of the deployment (the folder holding "
                            "startup/fed_admin.json); the cells are submitted as that lead")
    group.add_argument("--max-jobs", type=int, default=4, metavar="N",
                       help="flare: at most N of the sweep's jobs submitted and not yet ended at once (default 4); "
                            "the server's job scheduler runs as many of them at once as its max_jobs and the "
                            "sites' resources allow")
    group.add_argument("--site-gpus", type=int, default=0, metavar="G",
                       help="flare: GPUs each site reserves for one job (the job's resource_spec; default 0: CPU)")
    group.add_argument("--site-gpu-mem", type=non_negative, default=0.0, metavar="GIB",
                       help="flare: GiB of each reserved GPU one job takes (resource_spec mem_per_gpu_in_GiB; "
                            "several jobs share a GPU as far as its memory goes; default 0)")
    group.add_argument("--connect-timeout", type=seconds, default=15.0, metavar="S",
                       help="flare: seconds to wait for the deployment's server to answer (default 15)")
    group.add_argument("--reconnect-timeout", type=seconds, default=300.0, metavar="S",
                       help="flare: seconds to wait for a server that stopped answering mid-sweep (a restart) "
                            "before the running cells are given up as interrupted (default 300)")


def from_args(args: argparse.Namespace) -> FlareExecutor:
    if not args.kit:
        raise ExecutorError("--executor flare needs --kit ADMIN_KIT: a hospital lead's admin startup kit of the "
                            "deployment")
    return FlareExecutor(Path(args.kit), max_jobs=args.max_jobs, site_gpus=args.site_gpus,
                         site_gpu_mem=args.site_gpu_mem, connect_timeout=args.connect_timeout,
                         reconnect_timeout=args.reconnect_timeout)


# ----------------------------------------------------------------------------------------------- the admin kit


@dataclass(frozen=True)
class AdminKit:
    """An admin startup kit as its files state it: who it logs in as, with which role, to which server."""

    path: Path
    user: str  # the certificate's common name: the admin's login
    org: str
    role: str
    host: str
    port: int
    project: str

    @property
    def server(self) -> str:
        return f"{self.host}:{self.port}"


def read_admin_kit(path: Path) -> AdminKit:
    """The admin kit at ``path``: ExecutorError (one line naming ``--kit``) when the folder is not an admin startup
    kit (a site's or the server's kit, or none at all) or its files cannot be read."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID, ObjectIdentifier

    path = Path(path).expanduser().resolve()
    if not path.is_dir():
        raise ExecutorError(f"--kit {path}: no such folder")
    config_path = path / ADMIN_CONFIG
    if not config_path.is_file():
        other = next((kind for name, kind in OTHER_KITS.items() if (path / "startup" / name).is_file()), None)
        what = other or "not a startup kit"
        raise ExecutorError(f"--kit {path}: {what}, not an admin kit (no {ADMIN_CONFIG}); give a hospital lead's "
                            f"admin kit")
    try:
        admin = json.loads(config_path.read_text())["admin"]
        cert_path = path / "startup" / admin.get("client_cert", "client.crt")
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        host, port, project = str(admin["host"]), int(admin["port"]), str(admin.get("project_name", ""))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ExecutorError(f"--kit {path}: cannot read the admin kit's {ADMIN_CONFIG} or certificate: "
                            f"{type(e).__name__}: {e}") from None

    def field(oid: Any) -> str:
        found = cert.subject.get_attributes_for_oid(oid)
        return str(found[0].value) if found else ""

    return AdminKit(path, field(NameOID.COMMON_NAME), field(NameOID.ORGANIZATION_NAME),
                    field(ObjectIdentifier(ROLE_OID)), host, port, project)


def submitting_roles() -> list[str]:
    """The admin roles the project's authorization lets submit jobs (:func:`feddg.flare.site_policy.authorization`)."""
    from feddg.flare.site_policy import authorization

    return sorted(role for role, rights in authorization()["permissions"].items()
                  if rights.get("submit_job", "none") != "none")


def check_role(kit: AdminKit) -> None:
    """ExecutorError unless the kit's role may submit jobs under the project's authorization."""
    roles = submitting_roles()
    if kit.role not in roles:
        raise ExecutorError(f"--kit {kit.path}: the admin kit of {kit.user} ({kit.org}) has the role "
                            f"{kit.role or 'none'!r}, which may not submit jobs under the project's site policy; "
                            f"give the kit of a role that may ({', '.join(roles)})")


def missing_sites(wanted: Sequence[str], connected: Sequence[str]) -> list[str]:
    """The sites of ``wanted`` that are not among the deployment's ``connected`` clients, in ``wanted``'s order."""
    have = set(connected)
    return [site for site in dict.fromkeys(wanted) if site not in have]


# ------------------------------------------------------------------------------------------------ the job copy


def job_sites(job: Path) -> list[str]:
    """The sites of a rendered job (``data.sites`` of its ``feddg.yaml``), the held-out one included."""
    from feddg.flare.constants import CONFIG_FILE

    return list(_read_yaml(job / "app" / "config" / CONFIG_FILE)["data"]["sites"])


def submission(cell: Cell, target: Path, resource: dict[str, float]) -> Path:
    """The job folder the deployment receives for ``cell``, written at ``target/<run id>`` (replaced if there):
    the cell's job with its ``meta.json`` named after the run and asking every site for ``resource``
    (``resource_spec``), and on real data its ``data.root`` replaced by
    :data:`~feddg.flare.site_config.AT_EACH_SITE`. Returns the folder."""
    from feddg.flare.constants import CONFIG_FILE
    from feddg.flare.site_config import AT_EACH_SITE

    job = target / cell.run_id
    if job.exists():
        shutil.rmtree(job)
    shutil.copytree(cell.job, job)
    config_path = job / "app" / "config" / CONFIG_FILE
    experiment = _read_yaml(config_path)
    if experiment["data"].get("root") is not None:
        experiment["data"]["root"] = AT_EACH_SITE
        config_path.write_text(f"# {cell.run_id} as submitted to the deployment: each site reads its own data\n"
                               + yaml.safe_dump(experiment, sort_keys=False, default_flow_style=False))
    meta_path = job / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta.update(name=cell.run_id,
                resource_spec={site: dict(resource) for site in experiment["data"]["sites"]})
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    return job


def _read_yaml(path: Path) -> dict[str, Any]:
    experiment = yaml.safe_load(path.read_text())
    if not isinstance(experiment, dict) or not isinstance(experiment.get("data"), dict):
        raise ExecutorError(f"{path}: not a job's feddg.yaml (no data section)")
    return experiment


# ---------------------------------------------------------------------------------------------- the executor


@dataclass
class _Job:
    """One cell's job in the deployment."""

    cell: Cell
    job_id: str
    submitted: float
    restarts: int  # the server restarts the sweep had seen when it submitted the job
    started: float | None = None  # when the deployment first reported it running
    status: str = "SUBMITTED"


class DeploymentLost(RuntimeError):
    """The deployment's server stopped answering and did not come back within the reconnect bound."""


class FlareExecutor(CellExecutor):
    """Cells as jobs of a provisioned NVFlare deployment, submitted by the lead whose admin kit is ``kit`` (see the
    module docstring).

    Args:
        kit: the lead's admin startup kit.
        max_jobs: at most this many of the sweep's jobs submitted and not yet ended at once (1 or more).
        site_gpus, site_gpu_mem: each job's ``resource_spec`` at every site (``num_of_gpus``,
            ``mem_per_gpu_in_GiB``).
        connect_timeout: seconds the server has to answer a login.
        reconnect_timeout: seconds a server that stopped answering mid-sweep has to come back.
    """

    name: ClassVar[str] = "flare"
    data_here: ClassVar[bool] = False  # each site reads its own data_root; nothing of the data is on this host
    applies_cpu_pin: ClassVar[bool] = False  # the sites run as their hosts are set up (FEDDG_CPU_PIN there)

    def __init__(self, kit: Path, max_jobs: int = 4, site_gpus: int = 0, site_gpu_mem: float = 0.0,
                 connect_timeout: float = 15.0, reconnect_timeout: float = 300.0) -> None:
        if max_jobs < 1:
            raise ExecutorError(f"--max-jobs {max_jobs}: give the number of jobs at once, 1 or more")
        if site_gpus < 0 or site_gpu_mem < 0:
            raise ExecutorError(f"--site-gpus {site_gpus} / --site-gpu-mem {site_gpu_mem}: must not be negative")
        if connect_timeout <= 0 or reconnect_timeout < 0:
            raise ExecutorError(f"--connect-timeout {connect_timeout} / --reconnect-timeout {reconnect_timeout}: "
                                f"give seconds, the first above 0")
        self.kit_path = Path(kit)
        self.max_jobs = max_jobs
        self.resource = {"num_of_gpus": site_gpus, "mem_per_gpu_in_GiB": site_gpu_mem}
        self.connect_timeout, self.reconnect_timeout = connect_timeout, reconnect_timeout
        self.kit: AdminKit | None = None
        self._session: Any = None  # nvflare.fuel.flare_api.flare_api.Session, opened by check()
        self._server_start: Any = None  # the server's start time at the last login: a change is a restart
        self._server_restarts = 0  # restarts seen since the first login
        self._report: Report = print

    def describe(self) -> str:
        where = self.kit.server if self.kit else str(self.kit_path)
        who = f" as {self.kit.user}" if self.kit else ""
        return f"jobs of the NVFlare deployment at {where}{who}, at most {self.max_jobs} at once"

    # -------------------------------------------------------------------------------------------- refusals
    def check(self, cells: Sequence[Cell]) -> None:
        """Refuse before any submission (one line): not a lead's admin kit, a server that does not answer, a site
        of the cells' jobs that is not a connected client of the deployment."""
        kit = read_admin_kit(self.kit_path)
        check_role(kit)
        self.kit = kit
        self._connect(self.connect_timeout)
        connected = self._connected_sites()
        wanted = [site for cell in cells for site in job_sites(cell.job)]
        missing = missing_sites(wanted, connected)
        if missing:
            self.close()
            have = ", ".join(sorted(connected)) or "none"
            raise ExecutorError(f"--kit {kit.path}: the deployment at {kit.server} has no connected site "
                                f"{', '.join(missing)} (its connected sites: {have}); every site of the sweep's jobs "
                                f"(data.sites) must be a client of it")

    def _connect(self, timeout: float) -> None:
        """Log in as the kit's admin (ExecutorError naming the server when it does not answer or refuses the
        login) and note the server's start time."""
        from nvflare.fuel.flare_api.api_spec import AuthenticationError, AuthorizationError, NoConnection
        from nvflare.fuel.flare_api.flare_api import new_secure_session

        assert self.kit is not None
        try:
            self._session = new_secure_session(self.kit.user, str(self.kit.path), timeout=timeout)
        except NoConnection:
            raise ExecutorError(f"--kit {self.kit.path}: the deployment's server {self.kit.server} did not answer "
                                f"within {timeout:.0f} s; is it running and reachable from here?") from None
        except (AuthenticationError, AuthorizationError) as e:
            raise ExecutorError(f"--kit {self.kit.path}: the server {self.kit.server} refused the login of "
                                f"{self.kit.user}: {e}") from None
        self._server_start = self._session.get_system_info().server_info.start_time

    def _connected_sites(self) -> list[str]:
        return [c.name for c in self._session.get_system_info().client_info]

    def close(self) -> None:
        if self._session is not None:
            try:
                self._session.close()
            except Exception:  # noqa: BLE001 - logging out of a server that is gone is no error of the sweep
                pass
            self._session = None

    # ---------------------------------------------------------------------------------------------- the run
    def run_cells(self, cells: Sequence[Cell], on_done: OnDone, report: Report = print) -> None:
        self._report = report
        if self._session is None:
            self.check(cells)
        pending, running = deque(cells), []  # running: _Job, in submission order
        try:
            while pending or running:
                signum = STOP_SIGNALS.received
                if signum is not None:
                    self._abort_all(running, f"stopped by {signal.Signals(signum).name}", on_done, report)
                    return
                while pending and len(running) < self.max_jobs:
                    cell = pending.popleft()
                    try:
                        running.append(self._submit(cell, report))
                    except DeploymentLost:
                        raise
                    except Exception as e:  # noqa: BLE001 - the deployment refused this job: the run's failure
                        on_done(cell, self._refused(cell, f"the deployment refused the job: {type(e).__name__}: {e}"))
                for job in list(running):
                    try:
                        outcome = self._poll(job, report)
                    except DeploymentLost:
                        raise
                    except Exception as e:  # noqa: BLE001 - e.g. the job was deleted by an admin
                        outcome = self._ended(job, FAILED, f"job {job.job_id}: its status could not be read: "
                                                           f"{type(e).__name__}: {e}", None)
                    if outcome is not None:
                        running.remove(job)
                        on_done(job.cell, outcome)
                if running:
                    time.sleep(POLL_S)
        except DeploymentLost as e:
            report(f"    {e}; the cells not yet submitted are left for the next sweep")
            for job in running:
                on_done(job.cell, self._ended(job, INTERRUPTED, str(e), None))
            running.clear()
        finally:  # an exception on the way (not a signal): no job of the sweep is left running in the deployment
            if running:
                self._abort_all(running, "the sweep ended", lambda cell, outcome: None, report)
            self.close()

    def _submit(self, cell: Cell, report: Report) -> _Job:
        scratch = cell.folder / RESULT_DIR
        shutil.rmtree(scratch, ignore_errors=True)
        job = submission(cell, scratch / "job", self.resource)
        job_id = self._call(lambda s: s.submit_job(str(job)))
        self._log(cell, f"submitted {job} as job {job_id} to {self.kit.server if self.kit else '?'}")
        report(f"    {cell.run_id}: submitted as job {job_id}")
        return _Job(cell, job_id, time.monotonic(), self._server_restarts)

    def _poll(self, job: _Job, report: Report) -> Outcome | None:
        """The job's outcome once it has ended (downloaded), or None while it queues or runs; a job past its time
        limit (counted from its start) is aborted."""
        meta = self._call(lambda s: s.get_job_meta(job.job_id))
        status = str(meta.get("status", ""))
        if status != job.status:
            self._log(job.cell, f"job {job.job_id}: {status}")
            job.status = status
        if job.started is None and status == "RUNNING":
            job.started = time.monotonic()
            report(f"    {job.cell.run_id}: job {job.job_id} running")
        if status.startswith("FINISHED"):
            if status == COMPLETED:
                return self._download(job, OK, "")
            if self._server_restarts != job.restarts:
                return self._ended(job, INTERRUPTED, f"job {job.job_id} ended {status} while the deployment's "
                                                     f"server restarted", None)
            return self._download(job, FAILED, f"job {job.job_id} ended {status}")
        if self._server_restarts != job.restarts:
            if status in QUEUED:  # still in the job store's queue: the restarted server schedules it
                job.restarts = self._server_restarts
            else:  # NVFlare 2.9 resumes no job after a server restart: its record would say RUNNING for ever
                self._abort([job], report, wait=False)
                return self._ended(job, INTERRUPTED, f"the deployment's server restarted while job {job.job_id} "
                                                     f"was {status} (NVFlare resumes no job after a restart)", None)
        clock = job.started if job.started is not None else job.submitted
        if time.monotonic() - clock > job.cell.timeout:
            what = "running" if job.started is not None else "waiting to be scheduled"
            self._abort([job], report)
            return self._download(job, TIMEOUT, f"job {job.job_id} aborted after {job.cell.timeout:.0f} s {what}")
        return None

    def _download(self, job: _Job, status: str, reason: str) -> Outcome:
        """The job's result downloaded into the cell's scratch folder; the outcome with the server's run folder
        (where ``feddg_report.json`` is) and the server's job log appended to the cell's log."""
        from feddg.report import REPORT_FILE

        target = job.cell.folder / RESULT_DIR / "result"
        shutil.rmtree(target, ignore_errors=True)
        try:
            location = Path(self._call(lambda s: s.download_job_result(job.job_id, str(target))))
        except DeploymentLost:
            raise
        except Exception as e:  # noqa: BLE001 - a result that cannot be downloaded is the run's failure
            return self._ended(job, FAILED if status == OK else status,
                               f"{reason + '; ' if reason else ''}its result could not be downloaded: {e}", None)
        reports = sorted(location.rglob(REPORT_FILE), key=lambda p: len(p.parts))
        server_dir = reports[0].parent if reports else None
        logs = sorted(location.rglob("log.txt"), key=lambda p: len(p.parts))
        if logs:
            self._log(job.cell, f"--- the server's log of job {job.job_id} ({logs[0]}) ---\n"
                                + logs[0].read_text(errors="replace"))
            if status == FAILED:
                errors = [line for line in logs[0].read_text(errors="replace").splitlines()
                          if " ERROR " in line or "Error:" in line]
                if errors:
                    reason += f"; the server's last error: {errors[-1].strip()[-300:]}"
        return self._ended(job, status, reason, server_dir)

    def _refused(self, cell: Cell, reason: str) -> Outcome:
        """The outcome of a cell whose job the deployment did not accept."""
        self._log(cell, f"{FAILED}: {reason}")
        return Outcome(FAILED, reason, None, 0.0, None, cell.log, self._where(cell, None, "not submitted", 0.0),
                       scratch=cell.folder / RESULT_DIR)

    def _where(self, cell: Cell, job_id: str | None, job_status: str, queued: float) -> dict[str, Any]:
        """Where the cell ran, for its ``run.json``: the deployment's server and project, the lead who submitted it,
        the job and its final status, the sites, and how long it waited for the scheduler."""
        kit = self.kit
        return {"executor": self.name, "server": kit.server if kit else None, "project": kit.project if kit else None,
                "submitted_by": kit.user if kit else None, "job_id": job_id, "job_status": job_status,
                "sites": job_sites(cell.job), "queued_s": round(queued, 1), "attempts": 1}

    def _ended(self, job: _Job, status: str, reason: str, server_dir: Path | None) -> Outcome:
        """The outcome of a submitted job: its wall time counted from its start (0 if it never started)."""
        now = time.monotonic()
        started = job.started if job.started is not None else now
        self._log(job.cell, f"{status}{': ' + reason if reason else ''}")
        return Outcome(status, reason, None, now - started, server_dir, job.cell.log,
                       self._where(job.cell, job.job_id, job.status, started - job.submitted),
                       scratch=job.cell.folder / RESULT_DIR)

    # ------------------------------------------------------------------------------------------- stopping
    def _abort(self, jobs: Sequence[_Job], report: Report, wait: bool = True) -> None:
        """Abort ``jobs`` and (with ``wait``) wait at most :data:`ABORT_WAIT_S` until the deployment reports them
        ended."""
        from nvflare.fuel.flare_api.api_spec import JobNotRunning

        for job in jobs:
            try:
                self._call(lambda s: s.abort_job(job.job_id))
            except JobNotRunning:
                pass
            except DeploymentLost:
                return
            except Exception as e:  # noqa: BLE001 - the job may have ended meanwhile: its status says so below
                report(f"    {job.cell.run_id}: aborting job {job.job_id}: {type(e).__name__}: {e}")
        deadline = time.monotonic() + ABORT_WAIT_S
        left = list(jobs) if wait else []
        while left and time.monotonic() < deadline:
            try:
                left = [j for j in left
                        if not str(self._call(lambda s: s.get_job_meta(j.job_id)).get("status", "")).startswith(
                            "FINISHED")]
            except DeploymentLost:
                return
            if left:
                time.sleep(POLL_S)
        if left:
            report(f"    job(s) {', '.join(j.job_id for j in left)} not ended {ABORT_WAIT_S:.0f} s after the abort")

    def _abort_all(self, running: list[_Job], why: str, on_done: OnDone, report: Report) -> None:
        jobs, now = list(running), time.monotonic()
        running.clear()
        if jobs:
            report(f"    aborting the sweep's {len(jobs)} job(s) in the deployment: "
                   f"{', '.join(j.job_id for j in jobs)}")
            self._abort(jobs, report)
        for job in jobs:
            on_done(job.cell, self._ended(job, INTERRUPTED, f"{why} after {now - (job.started or now):.0f} s; job "
                                                            f"{job.job_id} aborted", None))

    # -------------------------------------------------------------------------------- one admin command
    def _call(self, command: Callable[[Any], T]) -> T:
        """``command(session)``; when the server stops answering, log in again (at most ``reconnect_timeout`` s,
        noting a restart when its start time changed) and run it once more. DeploymentLost when it does not come
        back."""
        from nvflare.fuel.flare_api.api_spec import NoConnection, SessionClosed

        try:
            return command(self._session)
        except (NoConnection, SessionClosed, ConnectionError):
            pass
        self.close()
        deadline = time.monotonic() + self.reconnect_timeout
        while True:
            try:
                previous = self._server_start
                self._connect(min(self.connect_timeout, max(1.0, deadline - time.monotonic())))
                if self._server_start != previous:
                    self._server_restarts += 1
                    self._report(f"    the deployment's server {self.kit.server if self.kit else '?'} restarted; "
                                 f"the sweep's jobs it had dispatched are given up (the next sweep runs them again)")
                return command(self._session)
            except (ExecutorError, NoConnection, SessionClosed, ConnectionError):
                self.close()
                if time.monotonic() >= deadline:
                    raise DeploymentLost(f"the deployment's server {self.kit.server if self.kit else '?'} stopped "
                                         f"answering and was not back within {self.reconnect_timeout:.0f} s") from None
                time.sleep(POLL_S)

    @staticmethod
    def _log(cell: Cell, line: str) -> None:
        cell.log.parent.mkdir(parents=True, exist_ok=True)
        with open(cell.log, "a") as f:
            f.write(f"{datetime.now().isoformat(sep=' ', timespec='milliseconds')} flare: {line}\n")
