"""The consortium on separate network stacks: provisioned kits, the server's real name, mTLS over TCP, link faults.

    feddg rehearse-network [JOB] --workspace DIR [--drills all|link-flap,foreign-kit] [--set KEY=VALUE ...]

1. **Kits as a hospital deployment gets them**: ``nvflare provision`` on the consortium's project
   (:func:`feddg.provisioning.project`, the job's hospitals) with the server named ``feddg-server.rehearsal.test``,
   then the project's site policy in every kit (:func:`feddg.flare.site_policy.install_site_policy`). A second
   provisioning of the same project (another root CA) gives the foreign kits of the ``foreign-kit`` drill.
2. **A network stack per participant** (:mod:`feddg.rehearsal.network`): the server, each hospital, the admins
   and an intruder, each in its own namespace on one bridge without uplink; the server's name resolves in those
   namespaces only. The isolation is checked before anything starts.
3. The server and each hospital start from their own kits (``startup/sub_start.sh``) inside their namespaces; the
   first hospital's lead submits the job from the admins' namespace (``nvflare job submit`` over TCP with mutual
   TLS to the server's name), the command waits with a bound, downloads the result and prints the metrics table.
4. **Drills** run while that job trains; each writes its outcome to ``DIR/drills.json``
   (``{"drills": [{"name", "passed", "figures", "detail"}]}``) and to the printed table.
5. Everything it started is stopped by process id, and the network is removed, on success, failure and Ctrl-C.

Needs root (network namespaces); sends nothing outside the namespaces it made.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from feddg.compute import SITE_PROCESSES_ENV
from feddg.config import FedDGConfig, load_config, parse_overrides
from feddg.flare.constants import CONFIG_FILE
from feddg.flare.controller import PROGRESS_FILE
from feddg.flare.site_policy import install_site_policy
from feddg.flare.timings import TIMINGS_FILE, read_timings
from feddg.jobs import override_job
from feddg.poc import POC, RehearsalError, _launch, download, server_errors, stop, stop_processes, submit, wait
from feddg.provisioning import ADMIN_PORT, FED_LEARN_PORT, PROJECT_ADMIN, hospital_admins, project
from feddg.rehearsal.network import DEFAULT_SUBNET, NetworkError, RehearsalNetwork
from feddg.report import format_table

SERVER_NAME = "feddg-server.rehearsal.test"
ADMINS = "admins"  # the namespace every admin of the consortium works from
INTRUDER = "intruder"  # the namespace of the foreign kits
DRILLS_FILE = "drills.json"
# Seconds without a heartbeat after which the server declares a hospital dead (the server kit's
# local/resources.json "heart_beat_timeout"; 600 s in a provisioned kit). Shortened so that a rehearsal's
# link-loss is seen in minutes; a link cut shorter than this is a flap.
HEART_BEAT_TIMEOUT = 30
FLAP_SECONDS = 10  # how long link-flap keeps a hospital's link down: well under HEART_BEAT_TIMEOUT


@dataclass
class DrillOutcome:
    name: str
    passed: bool
    figures: dict[str, Any] = field(default_factory=dict)
    detail: str = ""


@dataclass
class Rehearsal:
    """One provisioned consortium on its test network."""

    job: Path
    cfg: FedDGConfig  # the job's experiment
    poc: POC  # kits, processes and the per-participant namespaces (``POC.prefixes``)
    net: RehearsalNetwork
    foreign: Path  # the foreign provisioning's prod folder
    server_process: subprocess.Popen | None = None
    site_processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def workspace(self) -> Path:
        return self.poc.workspace

    def log(self, name: str) -> Path:
        """The console output of a process this rehearsal started."""
        return self.workspace / "logs" / f"{name}.log"

    @property
    def server_log(self) -> Path:
        """NVFlare's own log of the server's parent process (registrations, refused connections)."""
        return self.poc.kit(SERVER_NAME) / "log.txt"


# ---------------------------------------------------------------------------------------------------- kits
def provision(workspace: Path, task: str, sites: list[str], folder: str) -> Path:
    """``nvflare provision`` of the job's consortium (server ``SERVER_NAME``) into ``workspace/folder``, then the
    site policy in every kit. Returns the ``prod_00`` folder of the kits."""
    spec = project(task, server=SERVER_NAME, sites=sites)
    out = workspace / folder
    out.mkdir(parents=True)
    (out / "project.yml").write_text(yaml.safe_dump(spec, sort_keys=False))
    proc = subprocess.run(["nvflare", "provision", "-p", str(out / "project.yml"), "-w", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=out)
    prod = out / spec["name"] / "prod_00"
    if proc.returncode != 0 or not prod.is_dir():
        raise RehearsalError(f"nvflare provision ({folder}) failed (exit {proc.returncode}):\n"
                             f"{(proc.stdout + proc.stderr)[-2000:]}")
    install_site_policy(prod)
    resources = prod / SERVER_NAME / "local" / "resources.json"
    settings = json.loads(resources.read_text())
    settings["servers"][0]["heart_beat_timeout"] = HEART_BEAT_TIMEOUT
    resources.write_text(json.dumps(settings, indent=2))
    return prod


def setup(job: Path, workspace: Path, subnet: str = DEFAULT_SUBNET) -> Rehearsal:
    """Kits, foreign kits and the network (isolation checked); nothing started yet."""
    workspace = Path(workspace).resolve()
    old = RehearsalNetwork.leftover(workspace)
    if old is not None:
        left = old.teardown()
        if left:
            raise NetworkError(f"a previous rehearsal's network in {workspace} could not be removed: {left}")
    if workspace.exists():
        shutil.rmtree(workspace)
    workspace.mkdir(parents=True)
    cfg = load_config(job / "app" / "config" / CONFIG_FILE)
    sites = list(cfg.data.sites)
    prod = provision(workspace, cfg.data.task, sites, "kits")
    foreign = provision(workspace, cfg.data.task, sites, "foreign_kits")
    net = RehearsalNetwork.plan([SERVER_NAME, *sites, ADMINS, INTRUDER], SERVER_NAME, workspace, subnet)
    admins = [PROJECT_ADMIN, *(name for s in sites for name in hospital_admins(s).values())]
    prefixes = {SERVER_NAME: net.prefix(SERVER_NAME), **{s: net.prefix(s) for s in sites},
                **{a: net.prefix(ADMINS) for a in admins}}
    poc = POC(workspace, prod, SERVER_NAME, sites, hospital_admins(sites[0])["lead"], prefixes=prefixes)
    net.create()
    net.verify_isolated()
    return Rehearsal(job, cfg, poc, net, foreign)


# ---------------------------------------------------------------------------------------------------- processes
def start_server(r: Rehearsal, ready_timeout: float = 120) -> None:
    r.server_process = _launch(r.poc.kit(SERVER_NAME), r.log("server"), prefix=r.net.prefix(SERVER_NAME))
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
    # One machine plays every host: each hospital's job process takes its share of the cores (feddg.compute).
    env = {**os.environ, SITE_PROCESSES_ENV: str(len(r.poc.clients))}
    for site in r.poc.clients:
        r.site_processes[site] = _launch(r.poc.kit(site), r.log(site), env, prefix=r.net.prefix(site))
        r.poc.processes.append(r.site_processes[site])
    _wait_registered(r, r.poc.clients, 120)


def _wait_registered(r: Rehearsal, sites: list[str], timeout: float) -> None:
    """Until the server's log has each site's registration ("New client <site>@... joined"; the address there is
    what the client says of itself, not the connection's: its namespace lets it reach the server only over the
    test network)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = r.server_log.read_text(errors="replace") if r.server_log.exists() else ""
        if all(f"New client {s}@" in text for s in sites):
            return
        for site in sites:
            if r.site_processes[site].poll() is not None:
                raise RehearsalError(f"{site} exited at start; see {r.log(site)}")
        time.sleep(1)
    raise RehearsalError(f"not every hospital registered with the server within {timeout:.0f} s; see "
                         f"{r.server_log}")


def server_run_dir(r: Rehearsal, job_id: str) -> Path:
    return r.poc.kit(SERVER_NAME) / job_id


def rounds_completed(r: Rehearsal, job_id: str) -> int:
    try:
        return int(json.loads((server_run_dir(r, job_id) / PROGRESS_FILE).read_text())["rounds_completed"])
    except (OSError, ValueError, KeyError):
        return 0


def wait_for_rounds(r: Rehearsal, job_id: str, rounds: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while rounds_completed(r, job_id) < rounds:
        if time.monotonic() > deadline:
            raise RehearsalError(f"job {job_id}: fewer than {rounds} rounds after {timeout:.0f} s")
        time.sleep(0.2)


# ---------------------------------------------------------------------------------------------------- drills
def link_flap(r: Rehearsal, job_id: str) -> Callable[[dict], DrillOutcome]:
    """A training hospital's link goes down for FLAP_SECONDS (< the heartbeat timeout) just after round 1 starts,
    then comes back. Expected: every round has every training site. Returns the check of the job's report."""
    cfg = r.cfg
    victim = cfg.data.train_sites[-1]
    wait_for_rounds(r, job_id, 1, 600)
    cut = time.time()
    r.net.link(victim, up=False)
    time.sleep(FLAP_SECONDS)
    r.net.link(victim, up=True)

    def check(report: dict) -> DrillOutcome:
        history = report.get("history", [])
        train = set(cfg.data.train_sites)
        full = [h["round"] for h in history if set(h["sites"]) == train]
        durations = _round_seconds(report)
        figures = {"site": victim, "link_down_s": FLAP_SECONDS, "cut_at_round": 1, "rounds": len(history),
                   "sites_per_round": [len(h["sites"]) for h in history], "round_s": durations,
                   "round_1_waited_s": round(durations[1] - min(durations), 1) if len(durations) > 1 else None}
        passed = len(history) == cfg.train.rounds and len(full) == len(history)
        detail = (f"{victim}'s link was down {FLAP_SECONDS} s from {time.strftime('%H:%M:%S', time.localtime(cut))}; "
                  + ("every round had every training site" if passed else
                     f"rounds with every training site: {full} of {len(history)}"))
        return DrillOutcome("link-flap", passed, figures, detail)

    return check


def foreign_kit(r: Rehearsal, job_id: str) -> Callable[[dict], DrillOutcome]:
    """Kits from another provisioning of the same project (another root CA) try to join and to submit from the
    intruder's namespace while the job runs. Expected: every attempt refused by TLS, no connection from the
    intruder's address accepted by the server, the running job unaffected (checked on its report).

    The attempts: the foreign hospital's client as it comes (it does not trust our server's certificate); a TLS
    handshake with the foreign hospital's client certificate that trusts our root CA (public in every kit; a
    client kit with it swapped in fails its own startup signature check, so the handshake is made directly): the
    server must refuse the certificate; the same handshake with our own hospital's certificate, which must be
    accepted (so the refusal is the certificate's, not the network's); the foreign lead's admin console."""
    site = r.poc.clients[0]
    intruder = r.net.hosts[INTRUDER].address
    before = _server_log_size(r)
    attempts: dict[str, dict[str, Any]] = {}
    kit = r.foreign / site
    proc = _launch(kit, r.log("intruder_client"), prefix=r.net.prefix(INTRUDER))
    r.poc.processes.append(proc)
    text = _wait_for_line(kit / "log.txt", ("Successfully registered client", "failed with exception"), 180)
    stop_processes([proc])
    errors = [line.split(" - ", 3)[-1][:200] for line in text.splitlines() if " ERROR " in line]
    attempts["foreign client"] = {"refused": bool(text) and "Successfully registered client" not in text,
                                  "answer": errors[-1] if errors else "no connection attempt seen"}
    our_ca = r.poc.kit(site) / "startup" / "rootCA.pem"
    for name, certs in (("foreign certificate, our root CA", r.foreign / site / "startup"),
                        ("our hospital's certificate (control)", r.poc.kit(site) / "startup")):
        answer = _tls_handshake(r, certs / "client.crt", certs / "client.key", our_ca)
        attempts[name] = {"refused": answer != "accepted", "answer": answer}
    lead = r.foreign / hospital_admins(site)["lead"]
    admin = subprocess.run(r.net.prefix(INTRUDER) + ["nvflare", "job", "list", "--startup-kit", str(lead)],
                           capture_output=True, text=True, timeout=120, env=r.poc.env)
    out = (admin.stdout + admin.stderr).strip()
    attempts["foreign admin"] = {"refused": admin.returncode != 0, "answer": out.splitlines()[-1][:200] if out else ""}
    server_lines = [line for line in _server_log_since(r, before).splitlines() if intruder in line]

    def check(report: dict) -> DrillOutcome:
        cfg = r.cfg
        history = report.get("history", [])
        unaffected = len(history) == cfg.train.rounds and all(
            set(h["sites"]) == set(cfg.data.train_sites) for h in history)
        sessions = [line for line in server_lines if "is created" in line]  # an NVFlare connection: TLS passed
        expected = {name: not name.endswith("(control)") for name in attempts}
        as_expected = all(attempts[n]["refused"] == refused for n, refused in expected.items())
        passed = as_expected and not sessions and unaffected
        figures = {"attempts": attempts, "nvflare_connections_from_intruder": len(sessions),
                   "server_log_lines_naming_intruder": server_lines[-5:], "job_rounds": len(history)}
        detail = ("; ".join(f"{n}: {'refused' if a['refused'] else 'accepted'}" for n, a in attempts.items())
                  + f"; NVFlare connections from {intruder}: {len(sessions)}; job "
                  + ("unaffected" if unaffected else "AFFECTED"))
        return DrillOutcome("foreign-kit", passed, figures, detail)

    return check


def _tls_handshake(r: Rehearsal, cert: Path, key: Path, ca: Path) -> str:
    """A TLS handshake from the intruder's namespace to the server's port with ``cert``, checking the server's
    certificate against ``ca`` and the server's name: "accepted" or the error. TLS 1.2, so that the server's
    verdict on the client certificate is part of the handshake (TLS 1.3 would send it after the handshake ends;
    NVFlare's server accepts 1.2 and up). Nothing is sent after the handshake."""
    code = (
        "import socket,ssl,sys\n"
        "ctx=ssl.create_default_context(cafile=sys.argv[3]);ctx.load_cert_chain(sys.argv[4],sys.argv[5])\n"
        "ctx.maximum_version=ssl.TLSVersion.TLSv1_2\n"
        "try:\n"
        " with socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=20) as raw:\n"
        "  with ctx.wrap_socket(raw,server_hostname=sys.argv[1]):\n"
        "   print('accepted')\n"
        "except (ssl.SSLError, OSError) as e:\n"
        " print(type(e).__name__+': '+str(e))\n"
    )
    proc = subprocess.run(r.net.prefix(INTRUDER) + ["python3", "-c", code, SERVER_NAME, str(FED_LEARN_PORT),
                                                    str(ca), str(cert), str(key)],
                          capture_output=True, text=True, timeout=60)
    return (proc.stdout.strip() or proc.stderr.strip())[-200:]


DRILLS: dict[str, Callable[[Rehearsal, str], Callable[[dict], DrillOutcome]]] = {
    "link-flap": link_flap,
    "foreign-kit": foreign_kit,
}


def _wait_for_line(log: Path, needles: tuple[str, ...], timeout: float) -> str:
    """The text of ``log`` once it holds one of ``needles``; empty if none within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace") if log.exists() else ""
        if any(n in text for n in needles):
            return text
        time.sleep(1)
    return ""


def _round_seconds(report: dict) -> list[float]:
    timings = report.get("round_timings") or []
    return [round(t["ended"] - t["started"], 1) for t in timings]


def _server_log_size(r: Rehearsal) -> int:
    return r.server_log.stat().st_size if r.server_log.exists() else 0


def _server_log_since(r: Rehearsal, offset: int) -> str:
    with open(r.server_log, errors="replace") as f:
        f.seek(offset)
        return f.read()


# ---------------------------------------------------------------------------------------------------- the command
def parse_drills(text: str) -> list[str]:
    names = list(DRILLS) if text == "all" else [d.strip() for d in text.split(",") if d.strip()]
    unknown = [d for d in names if d not in DRILLS]
    if unknown:
        raise ValueError(f"unknown drill(s) {unknown}; the drills are {list(DRILLS)} (or all)")
    return names


def rehearse_network(job: Path, workspace: Path, drills: list[str], subnet: str = DEFAULT_SUBNET,
                     timeout: float = 3600, overrides: dict | None = None) -> list[DrillOutcome]:
    """Provision, build the network, start everything, submit ``job``, run ``drills`` during it, wait, download,
    print the metrics and the drills' table, write ``drills.json``, stop and remove everything."""
    job = Path(job).resolve()
    workspace = Path(workspace).resolve()
    if overrides:
        job = override_job(job, overrides, workspace.parent / f"{workspace.name}_job")
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
        job_id = submit(r.poc, job)
        print(f"job {job_id} submitted by {r.poc.lead} from the admins' namespace; drills: {drills or 'none'}",
              flush=True)
        checks = [DRILLS[name](r, job_id) for name in drills]
        status = wait(r.poc, job_id, timeout)
        if status != "FINISHED:COMPLETED":
            raise RehearsalError(f"job {job_id} ended with {status}; the server's errors:\n"
                                 f"{server_errors(r.poc, job_id, workspace / 'results' / job_id)}")
        report_path = download(r.poc, job_id, workspace / "results" / job_id)
        report = json.loads(report_path.read_text())
        report["round_timings"] = read_timings(report_path.parent / TIMINGS_FILE)
        outcomes = [check(report) for check in checks]
        print(f"\n{job.name} on separate network stacks, unseen site {report['unseen_site']} (report: "
              f"{report_path})\n{format_table(report['table'])}\n", flush=True)
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


def write_outcomes(workspace: Path, outcomes: list[DrillOutcome]) -> None:
    (Path(workspace) / DRILLS_FILE).write_text(json.dumps({"drills": [asdict(o) for o in outcomes]}, indent=2))
    width = max(len(o.name) for o in outcomes)
    print(f"{'drill':<{width}}  result  detail")
    for o in outcomes:
        print(f"{o.name:<{width}}  {'passed' if o.passed else 'FAILED':<6}  {o.detail}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", nargs="?", default="jobs/fundus_fedavg",
                        help="a job folder (default: jobs/fundus_fedavg, four hospitals)")
    parser.add_argument("--workspace", default="/tmp/feddg/rehearsal", help="folder (deleted and recreated)")
    parser.add_argument("--drills", default="all", help=f"all, or some of {','.join(DRILLS)}; '' for none")
    parser.add_argument("--subnet", default=DEFAULT_SUBNET, help="the test hosts' subnet, inside 198.18.0.0/15")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds to wait for the job")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="change a feddg.yaml setting of the job (repeatable)")


def run(args: argparse.Namespace) -> int:
    """Exit status: 0 the job finished and every drill passed; 1 a drill failed or the rehearsal stopped (the
    message says at which step); 130 interrupted."""
    try:
        drills = parse_drills(args.drills) if args.drills else []
        outcomes = rehearse_network(Path(args.job), Path(args.workspace), drills, args.subnet, args.timeout,
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
