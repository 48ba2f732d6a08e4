"""The consortium on separate network stacks: provisioned kits, the server's real name, mTLS over TCP, faults.

    feddg rehearse-network [JOB] --workspace DIR [--drills all|exposure,link-flap,...] [--set KEY=VALUE ...]

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
   Without JOB it runs a small job of its own (:func:`small_job`).
4. **Drills**, each writing its outcome to ``DIR/drills.json`` (``{"drills": [{"name", "passed", "figures",
   "detail"}]}``), to ``DIR/drills.md`` and to the printed table. Before the job: the port probe of
   ``exposure``; during it: the rest of ``exposure`` (who listens), ``link-flap``, then ``link-loss``, and beside
   them ``foreign-kit`` from the intruder's namespace; after it: ``server-restart``, with a job of its own and the
   resumed job that continues it.
5. Everything it started is stopped by process id (and whatever still runs inside its namespaces), and the
   network is removed, on success, failure and Ctrl-C.

Needs root (network namespaces); sends nothing outside the namespaces it made.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

from feddg.compute import SITE_PROCESSES_ENV
from feddg.config import FedDGConfig, load_config, parse_overrides
from feddg.flare.constants import CONFIG_FILE
from feddg.flare.controller import PROGRESS_FILE
from feddg.flare.site_policy import install_site_policy
from feddg.flare.timings import TIMINGS_FILE, read_timings
from feddg.jobs import TASK_DEFAULTS, override_job, write_job
from feddg.poc import (POC, RehearsalError, _launch, admin, download, server_errors, stop, stop_processes, submit,
                       wait)
from feddg.process_tree import send
from feddg.provisioning import ADMIN_PORT, FED_LEARN_PORT, PROJECT_ADMIN, hospital_admins, project
from feddg.rehearsal.network import DEFAULT_SUBNET, NetworkError, RehearsalNetwork, check_subnet, require_privileges
from feddg.report import format_table
from feddg.resume import GA_HISTORY, resume_job

SERVER_NAME = "feddg-server.rehearsal.test"
ADMINS = "admins"  # the namespace every admin of the consortium works from
INTRUDER = "intruder"  # the namespace of the foreign kits and of the port probe
DRILLS_FILE = "drills.json"
DRILLS_TABLE = "drills.md"
# Seconds without a heartbeat after which the server's parent process drops a hospital (the server kit's
# local/resources.json "heart_beat_timeout"; 600 s in a provisioned kit). This is the one that drops a site during
# a job: the job's own "server.heart_beat_timeout" sets the job process's copy, which no client heartbeats reach.
# Shortened so that a rehearsal's link-loss is seen in minutes; a link cut shorter than this is a flap.
HEART_BEAT_TIMEOUT = 30
# After the parent drops a hospital, the job keeps it on a watch list for NVFlare's "dead_client_grace_period"
# (60 s, not changed here) before it declares it disconnected (feddg's workflow then sends it no more tasks).
DEAD_CLIENT_GRACE = 60
FLAP_SECONDS = 10  # how long link-flap keeps a hospital's link down: well under HEART_BEAT_TIMEOUT
SMALL_SITES = ["BIDMC", "BMC", "RUNMC"]  # the small job's hospitals; RUNMC is its unseen site
SMALL_ROUNDS = 20


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
    cut: set[str] = field(default_factory=set)  # hospitals whose link a drill left down until the job ends
    probe: dict[str, Any] | None = None  # the exposure drill's port probe, taken before the job
    loss_round: int | None = None  # the round link-loss cut its link in: later rounds lack that site by design
    loss_site: str | None = None  # the hospital whose link link-loss cut

    @property
    def workspace(self) -> Path:
        return self.poc.workspace

    def log(self, name: str) -> Path:
        """The console output of a process this rehearsal started."""
        return self.workspace / "logs" / f"{name}.log"

    @property
    def server_log(self) -> Path:
        """NVFlare's own log of the server's parent process (registrations, dropped clients)."""
        return self.poc.kit(SERVER_NAME) / "log.txt"

    @property
    def job_store(self) -> Path:
        """Where the server keeps submitted jobs and finished jobs' results (moved into the workspace, see
        :func:`provision`)."""
        return self.poc.prod.parent.parent / "server_storage" / "jobs"


def small_job(out: Path) -> Path:
    """The rehearsal's own job when none is given: prostate GA on three hospitals (BIDMC and BMC train, RUNMC is
    unseen), ``SMALL_ROUNDS`` rounds of one epoch on 32 px synthetic volumes with a narrow U-Net. Seconds a round
    on a 2-core machine, and rounds enough for the link drills to act mid-job; GA, so that ``server-restart`` checks
    that a resumed job continues a method's history. At least one training site a round (so a lost site leaves a
    job that goes on), and a task timeout past the time NVFlare takes to declare a site gone."""
    exp = copy.deepcopy(TASK_DEFAULTS["prostate"])
    exp["data"].update(sites=SMALL_SITES, unseen_site="RUNMC", image_size=32,
                       synthetic={"seed": 0, "cases_per_site": 3, "slices_per_case": 4, "size": 32})
    exp["model"].update(features=[8, 8, 16, 32, 64, 8], dropout=0.0)
    exp["train"].update(rounds=SMALL_ROUNDS, local_epochs=1, batch_size=4, min_sites=1,
                        task_timeout=HEART_BEAT_TIMEOUT + DEAD_CLIENT_GRACE + 180)
    exp["eval"]["batch_size"] = 8
    if Path(out).exists():
        shutil.rmtree(out)
    return write_job(Path(out), "prostate_ga", exp)


# ---------------------------------------------------------------------------------------------------- kits
def provision(workspace: Path, task: str, sites: list[str], folder: str) -> Path:
    """``nvflare provision`` of the job's consortium (server ``SERVER_NAME``) into ``workspace/folder``, then the
    site policy in every kit. Returns the ``prod_00`` folder of the kits.

    Two changes to the server kit's ``local/resources.json``: ``heart_beat_timeout`` (``HEART_BEAT_TIMEOUT``), and the
    job store and snapshot store moved from the provisioned ``/tmp/nvflare/...`` (shared by every NVFlare server of
    the machine, and emptied by a reboot: a real deployment must move them to a kept disk as well) into
    ``workspace/folder/server_storage``."""
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
    storage = out / "server_storage"
    settings["snapshot_persistor"]["args"]["storage"]["args"]["root_dir"] = str(storage / "snapshots")
    for component in settings["components"]:
        if component["id"] == "job_manager":
            component["args"]["uri_root"] = str(storage / "jobs")
    resources.write_text(json.dumps(settings, indent=2))
    return prod


def refuse_if_running(workspace: Path) -> RehearsalNetwork | None:
    """The network an earlier rehearsal on ``workspace`` recorded (None if none); refused, naming its processes,
    while that rehearsal still runs."""
    old = RehearsalNetwork.leftover(workspace)
    if old is not None and old.owner_alive():
        raise NetworkError(f"{workspace} is in use by a running rehearsal (process {old.owner}; processes in "
                           f"its namespaces: {old.processes()}); stop it or choose another --workspace")
    return old


def clear_workspace(workspace: Path) -> None:
    """Remove what an earlier rehearsal on ``workspace`` left (its recorded network and whatever still runs in it);
    refused, naming its processes, while that rehearsal still runs."""
    old = refuse_if_running(workspace)
    if old is not None:
        left = old.teardown()
        if left:
            raise NetworkError(f"a previous rehearsal's network in {workspace} could not be removed: {left}")
    if workspace.exists():
        shutil.rmtree(workspace)


def setup(job: Path, workspace: Path, subnet: str = DEFAULT_SUBNET) -> Rehearsal:
    """Kits, foreign kits and the network (isolation checked); nothing started yet. Everything that can be refused
    (privileges, a workspace in use, the job's sites, the subnet) is checked before anything is made."""
    require_privileges()
    workspace = Path(workspace).resolve()
    cfg = load_config(job / "app" / "config" / CONFIG_FILE)
    sites = list(cfg.data.sites)
    project(cfg.data.task, server=SERVER_NAME, sites=sites)  # ValueError naming sites outside the consortium
    check_subnet(subnet)
    clear_workspace(workspace)
    workspace.mkdir(parents=True)
    prod = provision(workspace, cfg.data.task, sites, "kits")
    foreign = provision(workspace, cfg.data.task, sites, "foreign_kits")
    net = RehearsalNetwork.plan([SERVER_NAME, *sites, ADMINS, INTRUDER], SERVER_NAME, workspace, subnet)
    admins = [PROJECT_ADMIN, *(name for s in sites for name in hospital_admins(s).values())]
    prefixes = {SERVER_NAME: net.prefix(SERVER_NAME), **{s: net.prefix(s) for s in sites},
                **{a: net.prefix(ADMINS) for a in admins}}
    poc = POC(workspace, prod, SERVER_NAME, sites, hospital_admins(sites[0])["lead"], prefixes=prefixes)
    try:
        net.create()
        net.verify_isolated()
    except BaseException:
        net.teardown()  # whatever part of it was made
        raise
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


def _wait_registered(r: Rehearsal, sites: list[str], timeout: float, since: int = 0) -> dict[str, float]:
    """Until the server's log, from byte ``since`` on, has each site's registration ("New client <site>@... joined",
    or "Re-activate the client: <site>";
    the address there is what the client says of itself, not the connection's: its namespace lets it reach the
    server only over the test network). Returns the seconds each one took."""
    started = time.monotonic()
    took: dict[str, float] = {}
    while time.monotonic() - started < timeout:
        text = _server_log_since(r, since)
        for site in sites:
            # "Re-activate the client" where the server still knew the hospital's token (a link back up)
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
        if (r.job_store / job_id / "workspace").exists():  # the server stored the finished job's result
            raise RehearsalError(f"job {job_id} ended before {rounds} rounds were completed")
        if time.monotonic() > deadline:
            raise RehearsalError(f"job {job_id}: fewer than {rounds} rounds after {timeout:.0f} s")
        time.sleep(0.2)


# ---------------------------------------------------------------------------------------------------- drills
# A drill that acts during the job is called as ``drill(r, job_id)`` and returns the check of the job's report.
Check = Callable[[dict], DrillOutcome]


def probe_ports(r: Rehearsal) -> dict[str, Any]:
    """The first half of ``exposure``, before the job is submitted (a port probe may not meet a cut link): from the
    intruder's namespace, every TCP port (1-65535) of every other participant, once
    (:func:`feddg.rehearsal.probe.open_ports`), and what each open port gives a client without a kit's certificate
    (plain bytes, and a TLS handshake without a client certificate)."""
    targets = {name: host.address for name, host in r.net.hosts.items() if name != INTRUDER}
    started = time.monotonic()
    out = r.net.command(INTRUDER, [sys.executable, "-m", "feddg.rehearsal.probe", "ports", *targets.values()],
                        timeout=900).stdout
    by_address = json.loads(out)
    found = {name: by_address[address] for name, address in targets.items()}
    answers = {}
    for name, ports in found.items():
        for port in ports:
            reply = r.net.command(INTRUDER, [sys.executable, "-m", "feddg.rehearsal.probe", "serves",
                                             targets[name], str(port)], timeout=60).stdout
            answers[f"{name}:{port}"] = json.loads(reply)
    return {"ports_probed_per_host": 65535, "hosts": len(targets), "probe_s": round(time.monotonic() - started, 1),
            "open": found, "answers_without_certificate": answers}


def exposure(r: Rehearsal, job_id: str) -> Check:
    """The port probe taken before the job (:func:`probe_ports`, in ``r.probe``), and, once the job has completed a
    round, every participant's listening TCP sockets (``ss`` inside its namespace: the job processes' too).
    Expected: only the server's fed-learn and admin ports accept a connection from the network, neither gives
    anything to a client without a kit's certificate, and during the job nothing else listens on an address other
    than loopback."""
    wait_for_rounds(r, job_id, 1, 600)
    listening = {}
    for name in r.net.hosts:
        if name == INTRUDER:
            continue
        out = r.net.command(name, ["ss", "-Htln"]).stdout
        local = [line.split()[3] for line in out.splitlines() if len(line.split()) > 3]
        listening[name] = sorted(a for a in local if not a.startswith(("127.", "[::1]", "localhost")))
    probe = r.probe or {}
    found = probe.get("open", {})
    expected = {name: ([FED_LEARN_PORT, ADMIN_PORT] if name == SERVER_NAME else []) for name in found}
    served = {where: a for where, a in probe.get("answers_without_certificate", {}).items()
              if a.get("plain") != "nothing" or a.get("tls without a certificate") == "accepted"}
    server_ports = {f":{FED_LEARN_PORT}", f":{ADMIN_PORT}"}
    extra = {name: [a for a in addresses if not (name == SERVER_NAME and a[a.rfind(":"):] in server_ports)]
             for name, addresses in listening.items()}
    extra = {name: addresses for name, addresses in extra.items() if addresses}
    passed = bool(found) and found == expected and not served and not extra
    figures = {**probe, "listening_during_job": listening}

    def check(_report: dict) -> DrillOutcome:
        opened = ", ".join(f"{n}:{p}" for n, ports in found.items() for p in ports) or "none"
        detail = (f"open ports of {probe.get('hosts')} hosts ({probe.get('probe_s')} s for 65535 ports each): "
                  f"{opened}; " + ("nothing served without a kit's certificate" if not served else f"SERVED: {served}")
                  + "; during the job " + ("nothing else listens off loopback" if not extra
                                          else f"ALSO LISTENING: {extra}"))
        return DrillOutcome("exposure", passed, figures, detail)

    return check


def link_flap(r: Rehearsal, job_id: str) -> Check:
    """A training hospital's link goes down for FLAP_SECONDS (< the heartbeat timeout) once a round has been
    completed, then comes back. Expected: every round has every training site."""
    cfg = r.cfg
    victim = cfg.data.train_sites[-1]
    wait_for_rounds(r, job_id, 1, 600)
    at_round = rounds_completed(r, job_id)
    cut = time.time()
    r.net.link(victim, up=False)
    time.sleep(FLAP_SECONDS)
    r.net.link(victim, up=True)

    def check(report: dict) -> DrillOutcome:
        # with link-loss in the same job, the rounds from its cut on lack its site by design
        end = r.loss_round if r.loss_round is not None else cfg.train.rounds
        history = [h for h in report.get("history", []) if h["round"] < end]
        train = set(cfg.data.train_sites)
        full = [h["round"] for h in history if set(h["sites"]) == train]
        durations = _round_seconds(report)[:end]
        figures = {"site": victim, "link_down_s": FLAP_SECONDS, "cut_in_round": at_round,
                   "rounds_checked": len(history), "sites_per_round": [len(h["sites"]) for h in history],
                   "round_s": durations, "cut_round_waited_s": (round(durations[at_round] - min(durations), 1)
                                                                if len(durations) > at_round else None)}
        passed = len(history) == end > at_round + 1 and len(full) == len(history)
        detail = (f"{victim}'s link was down {FLAP_SECONDS} s in round {at_round} (from "
                  f"{time.strftime('%H:%M:%S', time.localtime(cut))}); "
                  + (f"rounds 0-{end - 1} all had every training site" if passed else
                     f"rounds with every training site: {len(full)} of the {len(history)} before round {end}"))
        return DrillOutcome("link-flap", passed, figures, detail)

    return check


def link_loss(r: Rehearsal, job_id: str) -> Check:
    """A training hospital's link goes down at the start of a round and stays down until the job ends. Expected:
    the server drops it (its parent after ``HEART_BEAT_TIMEOUT`` s without a heartbeat, the job after NVFlare's
    ``DEAD_CLIENT_GRACE`` more), the job goes on with the rest (the small job's ``train.min_sites`` is 1), and the
    report names the site and the round it was lost in; its evaluation is reported missing, never scored."""
    cfg = r.cfg
    victim = cfg.data.train_sites[0]
    done = rounds_completed(r, job_id)
    wait_for_rounds(r, job_id, done + 2, 600)  # cut at the start of a round, a full round after the flap's
    at_round = rounds_completed(r, job_id)
    r.loss_round = at_round
    left = cfg.train.rounds - at_round
    since = _server_log_size(r)
    cut, cut_at = time.monotonic(), time.time()
    r.net.link(victim, up=False)
    r.cut.add(victim)
    r.loss_site = victim
    dropped = _wait_for_line(r.server_log, (f"Remove the dead Client. Name: {victim}.",), HEART_BEAT_TIMEOUT + 120,
                             since)
    dropped_s = round(time.monotonic() - cut, 1) if dropped else None

    def check(report: dict) -> DrillOutcome:
        history = report.get("history", [])
        lost = [e for e in report.get("lost_sites", []) if e["site"] == victim]
        lost_round = lost[0]["round"] if lost else None
        declared_s = round(lost[0]["time"] - cut_at, 1) if lost else None
        after = [h for h in history if lost_round is not None and h["round"] > lost_round]
        final = report.get("models", {}).get("final", {})
        missing = victim in final.get("missing_sites", [])
        scored = sorted({row["site"] for row in report.get("table", [])})
        unseen_scored = cfg.data.unseen_site in scored
        figures = {"site": victim, "cut_in_round": at_round, "rounds_left_at_cut": left,
                   "dropped_by_server_after_s": dropped_s, "declared_disconnected_after_s": declared_s,
                   "lost_in_round": lost_round, "rounds": len(history),
                   "sites_per_round": [len(h["sites"]) for h in history], "round_s": _round_seconds(report),
                   "evaluation_missing": final.get("missing_sites", []), "sites_scored": scored,
                   "job_status": report.get("job_status")}
        passed = (left >= 2 and lost_round is not None and len(history) == cfg.train.rounds and bool(after)
                  and all(victim not in h["sites"] for h in after) and missing and victim not in scored
                  and unseen_scored)
        if left < 2:
            detail = f"the job had {left} round(s) left when the drill could cut a link; give it more rounds"
        else:
            detail = (f"{victim}'s link cut in round {at_round}: dropped by the server after {dropped_s} s, declared "
                      f"disconnected by the job after {declared_s} s; report: lost in round {lost_round}, "
                      f"{len(after)} later round(s) without it, its evaluation "
                      + ("reported missing" if missing else "NOT reported missing")
                      + f"; unseen site {cfg.data.unseen_site} " + ("scored" if unseen_scored else "NOT scored"))
        return DrillOutcome("link-loss", passed, figures, detail)

    return check


def foreign_kit(r: Rehearsal, job_id: str) -> Check:
    """Kits from another provisioning of the same project (another root CA) try to join and to submit from the
    intruder's namespace while the job runs. Expected: every attempt refused by TLS, no connection from the
    intruder's address accepted by the server, the running job unaffected (checked on its report).

    The attempts: the foreign hospital's client as it comes (it does not trust our server's certificate); a TLS
    handshake with the foreign hospital's client certificate that trusts our root CA (public in every kit; a
    client kit with it swapped in fails its own startup signature check, so the handshake is made directly): the
    server must refuse the certificate; the same handshake with our own hospital's certificate, which must be
    accepted (so the refusal is the certificate's, not the network's); the foreign lead's admin console, and, as
    its control, our own lead's admin kit from the same namespace, which must be let in and whose session must
    show in the server's log (so that no session for the foreign kits means refused, not unlogged)."""
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
    lead = hospital_admins(site)["lead"]

    def handshake(name: str, certs: Path) -> None:
        answer = r.net.command(INTRUDER, [sys.executable, "-m", "feddg.rehearsal.probe", "handshake", SERVER_NAME,
                                          str(FED_LEARN_PORT), str(our_ca), str(certs / "client.crt"),
                                          str(certs / "client.key")], timeout=60).stdout.strip()
        attempts[name] = {"refused": answer != '"accepted"', "answer": json.loads(answer) if answer else ""}

    def console(name: str, kit: Path) -> None:
        tried = subprocess.run(r.net.prefix(INTRUDER) + ["nvflare", "job", "list", "--startup-kit", str(kit)],
                               capture_output=True, text=True, timeout=120, env=r.poc.env)
        out = (tried.stdout + tried.stderr).strip()
        attempts[name] = {"refused": tried.returncode != 0, "answer": out.splitlines()[-1][:200] if out else ""}

    handshake("foreign certificate, our root CA", r.foreign / site / "startup")
    console("foreign admin", r.foreign / lead)
    controls_from = _server_log_size(r)
    foreign_lines = [line for line in _server_log_since(r, before).splitlines() if intruder in line]
    # The controls, from the same namespace with our own kits: they must get in, and the admin console's session
    # must show in the server's log, so that no session above means refused, not unlogged.
    handshake("our hospital's certificate (control)", r.poc.kit(site) / "startup")
    console("our lead's admin kit (control)", r.poc.kit(lead))
    control_lines = [line for line in _server_log_since(r, controls_from).splitlines() if intruder in line]

    def check(report: dict) -> DrillOutcome:
        cfg = r.cfg
        history = report.get("history", [])
        unaffected = len(history) == cfg.train.rounds
        # "Connection ... is created": an NVFlare session, i.e. TLS passed
        sessions = [line for line in foreign_lines if "is created" in line]
        control_sessions = [line for line in control_lines if "is created" in line]
        expected = {name: not name.endswith("(control)") for name in attempts}
        as_expected = all(attempts[n]["refused"] == refused for n, refused in expected.items())
        passed = as_expected and not sessions and bool(control_sessions) and unaffected
        figures = {"attempts": attempts, "nvflare_connections_from_intruder": len(sessions),
                   "nvflare_connections_of_the_controls": len(control_sessions),
                   "server_log_lines_naming_intruder": foreign_lines[-5:], "job_rounds": len(history)}
        detail = ("; ".join(f"{n}: {'refused' if a['refused'] else 'accepted'}" for n, a in attempts.items())
                  + f"; NVFlare connections from {intruder}: {len(sessions)} of the foreign kits, "
                  + f"{len(control_sessions)} of the controls; job "
                  + ("finished all its rounds" if unaffected else "AFFECTED"))
        return DrillOutcome("foreign-kit", passed, figures, detail)

    return check


def server_restart(r: Rehearsal, timeout: float) -> DrillOutcome:
    """A job of its own: once it has completed two rounds the server (its parent and job processes) is frozen, the
    checksums of every file in the job's server run folder and of every finished job's stored result are taken, and
    the server is killed (SIGKILL) and started again from its kit. Expected: those files unchanged, every hospital
    registered with the new server without being restarted (same process ids), and ``feddg resume-job`` continuing
    the run from its last completed round as a new job whose history (rounds, GA weights) continues the old one.

    NVFlare 2.9 does not resume a job after a server restart, nor close it: its job store still lists it as
    running. The drill records that status, aborts it as an operator would (``nvflare job abort``), and runs the
    resumed job instead."""
    job_id = submit(r.poc, r.job)
    wait_for_rounds(r, job_id, 2, timeout)
    run_dir = server_run_dir(r, job_id)
    server_tree = _tree(r.server_process)
    for proc in server_tree:
        send(proc, signal.SIGSTOP)
    done = rounds_completed(r, job_id)
    had_history = any(run_dir.rglob(GA_HISTORY))  # the method keeps a history the resumed job must continue
    kept = [run_dir, *(p for p in r.job_store.iterdir() if p.is_dir() and p.name != job_id)]
    before = _checksums(kept)
    for proc in server_tree:
        send(proc, signal.SIGKILL)
    psutil.wait_procs(server_tree, timeout=30)
    r.poc.processes.remove(r.server_process)
    r.server_process.wait(timeout=30)
    site_pids = {s: p.pid for s, p in r.site_processes.items()}
    since = _server_log_size(r)
    restarted = time.monotonic()
    start_server(r)
    listening_s = round(time.monotonic() - restarted, 1)
    reconnect_s = _wait_registered(r, list(r.site_processes), 300, since)
    same_sites = all(r.site_processes[s].pid == pid and r.site_processes[s].poll() is None
                     for s, pid in site_pids.items())
    after = _checksums(kept)
    changed = sorted(f for f in before if after.get(f) != before[f])
    old_status = _job_status(r, job_id)
    # What an operator does: write the resumed job from the run folder (it copies what it needs), then abort the
    # killed job so that the job store no longer lists it as running, then submit the resumed job.
    resumed, start_round, total = resume_job(r.job, run_dir, r.workspace / "resumed_job")
    admin(r.poc, ["abort", job_id, "--force"], 120, "job abort", check=False)
    aborted_status = _job_status(r, job_id)
    second = submit(r.poc, resumed)
    status = wait(r.poc, second, timeout)
    result = r.workspace / "results" / second
    report = json.loads(download(r.poc, second, result).read_text()) if status == "FINISHED:COMPLETED" else {}
    rounds = [h["round"] for h in report.get("history", [])]
    ga_files = [f for f in result.rglob(GA_HISTORY) if f.parent.name != "resume"] if report else []
    ga_rounds = [h["round"] for h in json.loads(ga_files[0].read_text())["history"]] if ga_files else None
    figures = {"rounds_before_kill": done, "files_checked": len(before), "files_changed": changed,
               "server_listening_after_s": listening_s, "hospitals_registered_after_s": reconnect_s,
               "hospitals_restarted": [s for s, pid in site_pids.items() if r.site_processes[s].pid != pid],
               "killed_job_status_after_restart": old_status, "killed_job_status_after_abort": aborted_status,
               "resumed_job_status": status,
               "resumed_from_round": start_round, "total_rounds": total, "resumed_rounds": rounds,
               "killed_job_had_ga_history": had_history, "ga_history_rounds": ga_rounds}
    passed = (not changed and len(before) > 0 and same_sites and status == "FINISHED:COMPLETED"
              and start_round == done and rounds == list(range(start_round, total))
              and (ga_rounds == list(range(total)) if had_history else ga_rounds is None))
    detail = (f"server killed after {done} rounds; {len(before)} files checked, "
              + (f"CHANGED: {changed}" if changed else "all unchanged")
              + f"; new server listening after {listening_s} s, hospitals back without restart after "
              + ", ".join(f"{s} {t} s" for s, t in reconnect_s.items())
              + f"; killed job listed as {old_status} ({aborted_status} after `nvflare job abort`); resumed job "
              + f"({status}) trained rounds "
              + (f"{rounds[0]}-{rounds[-1]}" if rounds else "none")
              + (f", GA history rounds 0-{ga_rounds[-1]}" if ga_rounds else ""))
    return DrillOutcome("server-restart", passed, figures, detail)


DURING_JOB: dict[str, Callable[[Rehearsal, str], Check]] = {
    "exposure": exposure,
    "link-flap": link_flap,
    "foreign-kit": foreign_kit,
    "link-loss": link_loss,
}
AFTER_JOB: dict[str, Callable[[Rehearsal, float], DrillOutcome]] = {"server-restart": server_restart}
DRILLS = [*DURING_JOB, *AFTER_JOB]  # the order they run in
INTRUDER_DRILLS = ("foreign-kit",)  # in a thread of its own, beside the link cuts


def _failed(name: str, detail: str) -> Check:
    return lambda _report: DrillOutcome(name, False, {}, detail)


def run_during_job(r: Rehearsal, job_id: str, names: list[str], thread_timeout: float = 900) -> dict[str, Check]:
    """The drills that act while ``job_id`` runs: the foreign kits in a thread, the rest here in their order. A
    drill that raises, or a thread that has not finished within ``thread_timeout`` s, gives a failed check that
    says so: every requested drill has its outcome."""
    checks: dict[str, Check] = {}

    def attempt(name: str) -> None:
        try:
            checks[name] = DURING_JOB[name](r, job_id)
        except Exception as e:  # noqa: BLE001 - any error is this drill's outcome, never the end of the others
            checks[name] = _failed(name, f"could not run: {type(e).__name__}: {e}")

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
    return {n: checks.get(n, _failed(n, f"did not finish within {thread_timeout:.0f} s"))
            for n in DURING_JOB if n in names}


def _tree(proc: subprocess.Popen) -> list[psutil.Process]:
    try:
        parent = psutil.Process(proc.pid)
        return [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _checksums(folders: list[Path]) -> dict[str, str]:
    """SHA-256 of every file under ``folders`` (logs excluded: NVFlare appends to them), by path."""
    sums = {}
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and not path.name.startswith("log") and path.suffix != ".log":
                sums[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return sums


def _job_status(r: Rehearsal, job_id: str) -> str:
    """The job's status as ``nvflare job list`` shows it to the lead."""
    out = admin(r.poc, ["list"], 120, "job list", check=False)
    for line in out.splitlines():
        if job_id in line:
            found = re.search(r"\b(FINISHED:[A-Z_]+|RUNNING|SUBMITTED|DISPATCHED|ABANDONED)\b", line)
            if found:
                return found.group(1)
    return "not listed"


def _wait_for_line(log: Path, needles: tuple[str, ...], timeout: float, since: int = 0) -> str:
    """The text of ``log`` from byte ``since`` on, once it holds one of ``needles``; empty if none within
    ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = _read_since(log, since)
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
    return _read_since(r.server_log, offset)


def _read_since(log: Path, offset: int) -> str:
    if not log.exists():
        return ""
    with open(log, errors="replace") as f:
        if offset > os.path.getsize(log):  # the log was rotated or restarted
            offset = 0
        f.seek(offset)
        return f.read()


# ---------------------------------------------------------------------------------------------------- the command
def parse_drills(text: str) -> list[str]:
    names = list(DRILLS) if text == "all" else [d.strip() for d in text.split(",") if d.strip()]
    unknown = [d for d in names if d not in DRILLS]
    if unknown:
        raise ValueError(f"unknown drill(s) {unknown}; the drills are {list(DRILLS)} (or all)")
    return [d for d in DRILLS if d in names]


def rehearse_network(job: Path | None, workspace: Path, drills: list[str], subnet: str = DEFAULT_SUBNET,
                     timeout: float = 3600, overrides: dict | None = None) -> list[DrillOutcome]:
    """Provision, build the network, start everything, submit ``job`` (None: :func:`small_job`), run ``drills``
    during and after it, wait, download, print the metrics and the drills' table, write ``drills.json``, stop and
    remove everything."""
    require_privileges()  # before anything is written
    workspace = Path(workspace).resolve()
    refuse_if_running(workspace)  # before the job folders beside it are rewritten
    job = Path(job).resolve() if job is not None else small_job(workspace.parent / f"{workspace.name}_job")
    if overrides:
        job = override_job(job, overrides, workspace.parent / f"{workspace.name}_job_set")
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
            rejoined: dict[str, float] | str = _restore_links(r)
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
        outcomes = [_judge(check, name, report) for name, check in checks.items()]
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


def _judge(check: Check, name: str, report: dict) -> DrillOutcome:
    """A drill's check of the report; one that raises is that drill's failure, not the others'."""
    try:
        return check(report)
    except Exception as e:  # noqa: BLE001
        return DrillOutcome(name, False, {}, f"its check raised {type(e).__name__}: {e}")


def _restore_links(r: Rehearsal) -> dict[str, float]:
    """Bring back the links a drill left down, and wait for those hospitals to register again (seconds each)."""
    if not r.cut:
        return {}
    since = _server_log_size(r)
    for site in sorted(r.cut):
        r.net.link(site, up=True)
    took = _wait_registered(r, sorted(r.cut), 300, since)
    r.cut.clear()
    return took


def drills_table(outcomes: list[DrillOutcome]) -> str:
    """The drills as a Markdown table (what the command prints and writes to ``drills.md``)."""
    lines = ["| drill | result | what happened |", "|---|---|---|"]
    lines += [f"| {o.name} | {'passed' if o.passed else 'FAILED'} | {o.detail.replace('|', '/')} |"
              for o in outcomes]
    return "\n".join(lines) + "\n"


def write_outcomes(workspace: Path, outcomes: list[DrillOutcome]) -> None:
    (Path(workspace) / DRILLS_FILE).write_text(json.dumps({"drills": [asdict(o) for o in outcomes]}, indent=2))
    table = drills_table(outcomes)
    (Path(workspace) / DRILLS_TABLE).write_text(table)
    print(table, flush=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", nargs="?", default=None,
                        help="a job folder (default: a small job of its own, three hospitals, see small_job)")
    parser.add_argument("--workspace", default="/tmp/feddg/rehearsal", help="folder (deleted and recreated)")
    parser.add_argument("--drills", default="all", help=f"all, or some of {','.join(DRILLS)}; '' for none")
    parser.add_argument("--subnet", default=DEFAULT_SUBNET, help="the test hosts' subnet, inside 198.18.0.0/15")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds to wait for each job")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="change a feddg.yaml setting of the job (repeatable)")


def run(args: argparse.Namespace) -> int:
    """Exit status: 0 the job finished and every drill passed; 1 a drill failed or the rehearsal stopped (the
    message says at which step); 130 interrupted."""
    try:
        drills = parse_drills(args.drills) if args.drills else []
        outcomes = rehearse_network(Path(args.job) if args.job else None, Path(args.workspace), drills,
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
