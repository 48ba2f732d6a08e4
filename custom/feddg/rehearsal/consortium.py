"""The rehearsal's consortium: provisioned kits, the network they run on, and the state the drills share.

``nvflare provision`` of the job's consortium project (:func:`feddg.provisioning.project`) with the server named
:data:`SERVER_NAME`, the project's site policy in every kit, a second provisioning of the same project (another root
CA) for the ``foreign-kit`` drill, and a network stack per participant (:mod:`feddg.rehearsal.network`), its
isolation checked. Nothing is started here (:mod:`feddg.rehearsal.processes`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from feddg.config import FedDGConfig
from feddg.experiment import load_experiment
from feddg.flare.constants import CONFIG_FILE
from feddg.flare.site_policy import install_site_policy
from feddg.folders import claim, guard_folder
from feddg.poc import POC, RehearsalError
from feddg.provisioning import PROJECT_ADMIN, hospital_admins, project
from feddg.rehearsal.network import DEFAULT_SUBNET, NetworkError, RehearsalNetwork, check_subnet, require_privileges

SERVER_NAME = "feddg-server.rehearsal.test"
ADMINS = "admins"  # the namespace every admin of the consortium works from
INTRUDER = "intruder"  # the namespace of the foreign kits and of the port probe
# Seconds without a heartbeat after which the server's parent process drops a hospital (the server kit's
# local/resources.json "heart_beat_timeout"; 600 s in a provisioned kit). This is the one that drops a site during
# a job: the job's own "server.heart_beat_timeout" sets the job process's copy, which no client heartbeats reach.
# Shortened so that a rehearsal's link-loss is seen in minutes; a link cut shorter than this is a flap.
HEART_BEAT_TIMEOUT = 30
# After the parent drops a hospital, the job keeps it on a watch list for NVFlare's "dead_client_grace_period"
# (60 s, not changed here) before it declares it disconnected (feddg's workflow then sends it no more tasks).
DEAD_CLIENT_GRACE = 60


@dataclass
class Rehearsal:
    """One provisioned consortium on its test network, and what the drills leave for each other."""

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

    def server_run_dir(self, job_id: str) -> Path:
        """The server's run folder of a job (its report, progress file and the methods' server files)."""
        return self.poc.kit(SERVER_NAME) / job_id


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
    cfg = load_experiment(job / "app" / "config" / CONFIG_FILE)
    sites = list(cfg.data.sites)
    project(cfg.data.task, server=SERVER_NAME, sites=sites)  # ValueError naming sites outside the consortium
    check_subnet(subnet)
    guard_folder(workspace, "--workspace", inputs=[job])  # cleared below: a folder of ours only
    clear_workspace(workspace)
    claim(workspace, "feddg rehearse-network --workspace")
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
