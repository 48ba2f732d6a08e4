"""The consortium on separate network stacks: provisioned kits, the server's real name, mTLS over TCP, faults.

    feddg rehearse-network [JOB] --workspace DIR [--drills all|exposure,link-flap,...] [--set KEY=VALUE ...]

1. **Kits as a hospital deployment gets them** (:mod:`feddg.rehearsal.consortium`): ``nvflare provision`` on the
   consortium's project (:func:`feddg.provisioning.project`, the job's hospitals) with the server named
   ``feddg-server.rehearsal.test``, then the project's site policy in every kit
   (:func:`feddg.flare.site_policy.install_site_policy`). A second provisioning of the same project (another root
   CA) gives the foreign kits of the ``foreign-kit`` drill.
2. **A network stack per participant** (:mod:`feddg.rehearsal.network`): the server, each hospital, the admins
   and an intruder, each in its own namespace on one bridge without uplink; the server's name resolves in those
   namespaces only. The isolation is checked before anything starts.
3. The server and each hospital start from their own kits (``startup/sub_start.sh``) inside their namespaces
   (:mod:`feddg.rehearsal.processes`); the first hospital's lead submits the job from the admins' namespace
   (``nvflare job submit`` over TCP with mutual TLS to the server's name), the command waits with a bound, downloads
   the result and prints the metrics table. Without JOB it runs a small job of its own
   (:func:`feddg.rehearsal.small_job.small_job`).
4. **Drills** (:mod:`feddg.rehearsal.drills`, one module each), each writing its outcome to ``DIR/drills.json``,
   to ``DIR/drills.md`` and to the printed table (:mod:`feddg.rehearsal.outcomes`). Before the job: the port probe
   of ``exposure``; during it: the rest of ``exposure`` (who listens), ``link-flap``, then ``link-loss``, and beside
   them ``foreign-kit`` from the intruder's namespace; after it: ``server-restart``, with a job of its own and the
   resumed job that continues it.
5. Everything it started is stopped by process id (and whatever still runs inside its namespaces), and the
   network is removed, on success, failure and Ctrl-C.

Needs root (network namespaces); sends nothing outside the namespaces it made. The options are declared in
:mod:`feddg.rehearsal.options` (import-light, for ``--help``); this module runs the rehearsal.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from feddg.experiment import parse_overrides
from feddg.folders import guard_folder
from feddg.flare.timings import TIMINGS_FILE, read_timings
from feddg.jobs import override_job
from feddg.poc import RehearsalError, download, server_errors, stop, submit, wait
from feddg.rehearsal.consortium import Rehearsal, refuse_if_running, setup
from feddg.rehearsal.drills.exposure import exposure, probe_ports
from feddg.rehearsal.drills.foreign_kit import foreign_kit
from feddg.rehearsal.drills.link_flap import link_flap
from feddg.rehearsal.drills.link_loss import link_loss
from feddg.rehearsal.drills.server_restart import server_restart
from feddg.rehearsal.network import DEFAULT_SUBNET, NetworkError, require_privileges
from feddg.rehearsal.options import add_arguments, parse_drills
from feddg.rehearsal.outcomes import Check, DrillOutcome, failed, judge, write_outcomes
from feddg.rehearsal.processes import restore_links, start_server, start_sites
from feddg.rehearsal.small_job import small_job
from feddg.report import format_table

# The drills by the names of feddg.rehearsal.options, in the order they run.
DURING_JOB: dict[str, Callable[[Rehearsal, str], Check]] = {
    "exposure": exposure,
    "link-flap": link_flap,
    "foreign-kit": foreign_kit,
    "link-loss": link_loss,
}
AFTER_JOB: dict[str, Callable[[Rehearsal, float], DrillOutcome]] = {"server-restart": server_restart}
INTRUDER_DRILLS = ("foreign-kit",)  # in a thread of its own, beside the link cuts


def run_during_job(r: Rehearsal, job_id: str, names: list[str], thread_timeout: float = 900) -> dict[str, Check]:
    """The drills that act while ``job_id`` runs: the foreign kits in a thread, the rest here in their order. A
    drill that raises, or a thread that has not finished within ``thread_timeout`` s, gives a failed check that
    says so: every requested drill has its outcome."""
    checks: dict[str, Check] = {}

    def attempt(name: str) -> None:
        try:
            checks[name] = DURING_JOB[name](r, job_id)
        except Exception as e:  # noqa: BLE001 - any error is this drill's outcome, never the end of the others
            checks[name] = failed(name, f"could not run: {type(e).__name__}: {e}")

    intruder = [threading.Thread(target=attempt, args=(n,), name=n, daemon=True)
                for n in INTRUDER_DRILLS if n in names]
    for thread in intruder:
        thread.start()
    try:
        for name in (n for n in DURING_JOB if n in names and n not in INTRUDER_DRILLS):
            attempt(name)
    finally:  # also on Ctrl-C: the thread's processes are stopped with the rest only after it is joined or timed out
        for thread in intruder:
            thread.join(thread_timeout)
    return {n: checks.get(n, failed(n, f"did not finish within {thread_timeout:.0f} s"))
            for n in DURING_JOB if n in names}


def rehearse_network(job: Path | None, workspace: str | Path, drills: list[str], subnet: str = DEFAULT_SUBNET,
                     timeout: float = 3600, overrides: dict | None = None) -> list[DrillOutcome]:
    """Provision, build the network, start everything, submit ``job`` (None: :func:`small_job`), run ``drills``
    during and after it, wait, download, print the metrics and the drills' table, write ``drills.json``, stop and
    remove everything."""
    # Every folder this replaces is checked before anything is written (feddg.folders): the workspace, the small
    # job beside it and the --set copy of the job.
    inputs = [job] if job is not None else []
    workspace = guard_folder(workspace, "--workspace", inputs=inputs)
    small = guard_folder(workspace.parent / f"{workspace.name}_job", "--workspace (its job folder <ws>_job)",
                         inputs=inputs)
    copies = guard_folder(workspace.parent / f"{workspace.name}_job_set", "--workspace (its --set copy "
                          "<ws>_job_set)", inputs=inputs) if overrides else None
    require_privileges()  # before anything is written
    refuse_if_running(workspace)  # before the job folders beside it are rewritten
    job = Path(job).resolve() if job is not None else small_job(small)
    if copies is not None:
        job = override_job(job, overrides, copies / job.name, claim_as="feddg rehearse-network --set")
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    r = None
    outcomes: list[DrillOutcome] = []
    try:
        r = setup(job, workspace, subnet)
        print(f"network {r.net.subnet} on bridge {r.net.bridge}: "
              + ", ".join(f"{h.name} {h.address}" for h in r.net.hosts.values()), flush=True)
        start_server(r)
        start_sites(r)
        if "exposure" in drills:
            r.probe = probe_ports(r)
        job_id = submit(r.poc, job)
        during = [d for d in drills if d in DURING_JOB]
        print(f"job {job_id} submitted by {r.poc.lead} from the admins' namespace; drills: {drills or 'none'}",
              flush=True)
        checks = run_during_job(r, job_id, during)
        status = wait(r.poc, job_id, timeout)
        try:
            rejoined: dict[str, float] | str = restore_links(r)
        except (RehearsalError, NetworkError, subprocess.SubprocessError) as e:
            rejoined = f"{type(e).__name__}: {e}"  # link-loss fails on it; the other drills keep their outcome
        report_path, report = None, {}
        if status in ("FINISHED:COMPLETED", "FINISHED:ABNORMAL"):
            report_path = download(r.poc, job_id, workspace / "results" / job_id)
            report = json.loads(report_path.read_text())
        # A site lost for good never reports the job's end to the server: NVFlare 2.9 then ends the job
        # FINISHED:ABNORMAL after the workflow finished. Accepted only where link-loss cut a site that the report
        # names as lost; anything else is the job's failure.
        lost = {e["site"] for e in report.get("lost_sites", [])}
        if status != "FINISHED:COMPLETED" and not (status == "FINISHED:ABNORMAL" and r.loss_site in lost):
            outcomes = [DrillOutcome(name, False, {}, f"the job ended {status}") for name in checks]
            raise RehearsalError(f"job {job_id} ended with {status}; the server's errors:\n"
                                 f"{server_errors(r.poc, job_id, workspace / 'results' / job_id)}")
        report["round_timings"] = read_timings(report_path.parent / TIMINGS_FILE)
        report["job_status"] = status
        outcomes = [judge(check, name, report) for name, check in checks.items()]
        for outcome in outcomes:
            if outcome.name == "link-loss":
                outcome.figures["rejoined_after_link_up_s"] = rejoined
                if isinstance(rejoined, str):
                    outcome.passed = False
                    outcome.detail += f"; its link could not be restored: {rejoined}"
        print(f"\n{job.name} on separate network stacks, unseen site {report['unseen_site']} ({status}; report: "
              f"{report_path})\n{format_table(report['table'])}\n", flush=True)
        missing = report["models"]["final"].get("missing_sites", [])
        if missing:
            print(f"not evaluated (reported missing, not scored): {missing}\n", flush=True)
        for name in (d for d in drills if d in AFTER_JOB):
            try:
                outcomes.append(AFTER_JOB[name](r, timeout))
            except Exception as e:  # noqa: BLE001 - recorded as the drill's failure, beside the others' outcomes
                outcomes.append(DrillOutcome(name, False, {}, f"stopped: {type(e).__name__}: {e}"))
        return outcomes
    finally:
        if r is not None:
            stop(r.poc)
            left = r.net.teardown()
            if left:
                print(f"could not remove: {left}", flush=True)
        signal.signal(signal.SIGTERM, previous)
        if outcomes:
            write_outcomes(workspace, outcomes)


def run(args: argparse.Namespace) -> int:
    """``feddg rehearse-network`` with its parsed options (:func:`feddg.rehearsal.options.add_arguments`).

    Exit status: 0 the job finished and every drill passed; 1 a drill failed or the rehearsal stopped (the message
    says at which step); 130 interrupted."""
    try:
        drills = parse_drills(args.drills) if args.drills else []
        outcomes = rehearse_network(Path(args.job) if args.job else None, args.workspace, drills,
                                    args.subnet, args.timeout,
                                    parse_overrides(args.overrides) if args.overrides else None)
    except (RehearsalError, NetworkError, ValueError) as e:
        print(f"feddg rehearse-network: {e}", flush=True)
        return 1
    except KeyboardInterrupt:
        print("feddg rehearse-network: interrupted; everything it started is stopped", flush=True)
        return 130
    return 0 if all(o.passed for o in outcomes) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="feddg rehearse-network", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))
