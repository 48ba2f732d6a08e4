"""The rehearsal's test network (feddg.rehearsal.network), made for real: namespaces, veths, one bridge."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from feddg.folders import claim

from feddg.rehearsal.network import NetworkError, RehearsalNetwork, check_subnet
from tests.conftest import needs_netns

SERVER = "feddg-server.rehearsal.test"


def _plan(tmp_path: Path, subnet: str = "198.19.7.0/24") -> RehearsalNetwork:
    return RehearsalNetwork.plan([SERVER, "BIDMC", "admins"], SERVER, tmp_path, subnet=subnet)


def test_plan_names_fit_the_kernel_and_addresses_are_distinct(tmp_path):
    net = _plan(tmp_path)
    assert all(len(h.port) <= 15 for h in net.hosts.values()) and len(net.bridge) <= 15
    assert len({h.address for h in net.hosts.values()}) == 3
    assert len({h.namespace for h in net.hosts.values()}) == 3
    with pytest.raises(NetworkError, match="not among the participants"):
        RehearsalNetwork.plan(["BIDMC"], SERVER, tmp_path)


@needs_netns
def test_a_subnet_outside_the_benchmark_range_or_on_a_route_is_refused(tmp_path):
    with pytest.raises(NetworkError, match="198.18.0.0/15"):
        check_subnet("10.20.0.0/24")
    subprocess.run(["ip", "link", "add", "fdgtestdum", "type", "bridge"], check=True)
    try:
        subprocess.run(["ip", "addr", "add", "198.19.200.1/24", "dev", "fdgtestdum"], check=True)
        with pytest.raises(NetworkError, match="fdgtestdum"):
            check_subnet("198.19.200.0/25")
        check_subnet("198.19.201.0/24")  # the next one is free
    finally:
        subprocess.run(["ip", "link", "del", "fdgtestdum"], check=False)


@needs_netns
def test_the_network_connects_its_hosts_isolates_them_and_cuts_a_link(tmp_path):
    net = _plan(tmp_path)
    listener = None
    try:
        net.create()
        net.verify_isolated()
        # the server's name resolves inside the namespaces only
        assert net.hosts[SERVER].address in net.command("BIDMC", ["getent", "hosts", SERVER]).stdout
        assert subprocess.run(["getent", "hosts", SERVER], capture_output=True).returncode != 0
        server = net.hosts[SERVER]
        code = ("import socket,time\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
                f"s.bind(('{server.address}',18002));s.listen(8)\nend=time.time()+60\ns.settimeout(1)\n"
                "while time.time()<end:\n try:\n  c,_=s.accept();c.close()\n except OSError:\n  pass\n")
        listener = subprocess.Popen(net.prefix(SERVER) + [sys.executable, "-c", code])
        deadline = time.monotonic() + 20
        while not net.can_reach("BIDMC", SERVER, 18002) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert net.can_reach("BIDMC", SERVER, 18002)
        net.link("BIDMC", up=False)
        assert not net.can_reach("BIDMC", SERVER, 18002, timeout=1.0)
        assert net.can_reach("admins", SERVER, 18002)  # only BIDMC's link is down
        net.link("BIDMC", up=True)
        deadline = time.monotonic() + 20
        while not net.can_reach("BIDMC", SERVER, 18002) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert net.can_reach("BIDMC", SERVER, 18002)
        # a default route in one namespace is found and named
        subprocess.run(["ip", "-n", net.hosts["admins"].namespace, "route", "add", "default", "dev", "eth0"],
                       check=True)
        with pytest.raises(NetworkError, match="admins: a default route"):
            net.verify_isolated()
    finally:
        if listener is not None:
            listener.kill()
            listener.wait(10)
        left = net.teardown()
    assert left == []
    assert not any(Path("/run/netns", h.namespace).exists() for h in net.hosts.values())
    assert subprocess.run(["ip", "link", "show", net.bridge], capture_output=True).returncode != 0
    assert not any(Path("/etc/netns", h.namespace).exists() for h in net.hosts.values())


@needs_netns
def test_a_recorded_network_is_found_and_removed_by_a_later_run(tmp_path):
    """A run killed with a process still inside its network: the next run finds the record, stops that process
    (it runs in one of the recorded namespaces, so it is the killed run's) and removes the rest."""
    net = _plan(tmp_path, "198.19.8.0/24")
    left_running = None
    try:
        net.create()
        left_running = subprocess.Popen(net.prefix("BIDMC") + ["sleep", "300"])
        deadline = time.monotonic() + 10
        while not net.processes() and time.monotonic() < deadline:
            time.sleep(0.1)
        again = RehearsalNetwork.leftover(tmp_path)
        assert again == net and again.processes() == {net.hosts["BIDMC"].namespace: [left_running.pid]}
    finally:
        assert RehearsalNetwork.leftover(tmp_path).teardown() == []
        if left_running is not None:
            assert left_running.wait(timeout=10) is not None  # stopped by the teardown


@needs_netns
def test_a_network_whose_rehearsal_died_is_removed_by_the_next_network_made_on_the_host(tmp_path):
    """A rehearsal killed before its teardown (SIGKILL, a stopped test runner) in a workspace nobody uses again:
    the host-wide record lets the next network made anywhere remove it; a live rehearsal's network stays."""
    from feddg.rehearsal.network import REGISTRY, reap_orphans

    dead = subprocess.Popen(["true"])
    dead.wait()
    orphan = RehearsalNetwork(**{**_plan(tmp_path / "killed", "198.19.9.0/24").__dict__, "owner": dead.pid})
    later = _plan(tmp_path / "later", "198.19.10.0/24")
    try:
        orphan.create()
        assert (REGISTRY / f"{orphan.bridge}.json").is_file()
        assert Path("/run/netns", orphan.hosts["BIDMC"].namespace).exists()
        later.create()  # reaps the orphan first
        assert not Path("/run/netns", orphan.hosts["BIDMC"].namespace).exists()
        assert not (REGISTRY / f"{orphan.bridge}.json").exists()
        assert (REGISTRY / f"{later.bridge}.json").is_file() and reap_orphans() == []  # its owner runs: kept
    finally:
        assert orphan.teardown() == [] and later.teardown() == []
    assert not (REGISTRY / f"{later.bridge}.json").exists()


# ---------------------------------------------------------------------- the command's refusals (no root needed)
def test_an_unknown_drill_is_refused_listing_the_valid_ones():
    from feddg.rehearsal.options import DRILLS, parse_drills

    with pytest.raises(ValueError, match="link-lost.*link-flap"):
        parse_drills("link-lost")
    assert parse_drills("server-restart,exposure") == ["exposure", "server-restart"]  # run in their fixed order
    assert parse_drills("all") == DRILLS


def test_missing_privileges_are_named_and_nothing_is_written(tmp_path, monkeypatch):
    import feddg.rehearsal.network as network
    from feddg.rehearsal.command import rehearse_network

    monkeypatch.setattr(network, "missing_privileges", lambda: ["CAP_NET_ADMIN (run as root)"])
    with pytest.raises(NetworkError, match="CAP_NET_ADMIN"):
        rehearse_network(None, tmp_path / "ws", ["link-flap"])
    assert list(tmp_path.iterdir()) == []  # not even the small job


def test_a_workspace_of_a_running_rehearsal_is_refused_naming_its_process(tmp_path, monkeypatch):
    import dataclasses
    import json

    import psutil

    import feddg.rehearsal.network as network
    from feddg.rehearsal.command import rehearse_network
    from feddg.rehearsal.consortium import clear_workspace

    monkeypatch.setattr(network, "missing_privileges", lambda: [])  # the refusal comes before any privileged step
    ws = tmp_path / "ws"
    claim(ws, "feddg rehearse-network --workspace")  # as the running rehearsal made it (feddg.folders)
    net = _plan(ws)
    net.owner, net.owner_started = 1, psutil.Process(1).create_time()  # a process that runs: "the rehearsal"
    (ws / "kits").mkdir(parents=True)
    (ws / "network.json").write_text(json.dumps(dataclasses.asdict(net)))
    with pytest.raises(NetworkError, match="in use by a running rehearsal \\(process 1"):
        clear_workspace(ws)
    with pytest.raises(NetworkError, match="in use by a running rehearsal \\(process 1"):
        rehearse_network(None, ws, ["link-flap"])
    assert (ws / "kits").is_dir()  # nothing removed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ws"]  # the small job beside it not (re)written
    net.owner_started += 1  # the same id, another process: the rehearsal is gone
    assert not RehearsalNetwork(**{**net.__dict__}).owner_alive()


def test_the_small_job_has_three_hospitals_rounds_for_the_drills_and_a_minimum_of_one(tmp_path):
    from feddg.experiment import load_experiment
    from feddg.rehearsal.consortium import DEAD_CLIENT_GRACE, HEART_BEAT_TIMEOUT
    from feddg.rehearsal.small_job import small_job

    cfg = load_experiment(small_job(tmp_path / "job") / "app" / "config" / "feddg.yaml")
    assert len(cfg.data.sites) == 3 and cfg.data.unseen_site not in cfg.data.train_sites
    assert cfg.train.min_sites == 1 and cfg.train.rounds >= 10
    assert cfg.train.task_timeout > HEART_BEAT_TIMEOUT + DEAD_CLIENT_GRACE  # a lost site is declared in its round


@needs_netns
def test_a_job_with_sites_outside_the_consortium_is_refused_before_anything_is_made(tmp_path):
    from feddg.recipes.export import write_job
    from feddg.rehearsal.consortium import setup
    from tests.conftest import tiny_experiment

    exp = tiny_experiment("prostate")
    exp["data"].update(sites=["BIDMC", "BMC", "Mayo"], unseen_site="Mayo")
    job = write_job(tmp_path / "jobs", "prostate_fedavg", exp)
    with pytest.raises(ValueError, match="Mayo"):
        setup(job, tmp_path / "ws")
    assert not (tmp_path / "ws").exists()


def test_every_requested_drill_has_an_outcome_even_when_one_raises_or_hangs(monkeypatch):
    import threading

    from feddg.rehearsal import command
    from feddg.rehearsal.outcomes import DrillOutcome, judge

    release = threading.Event()

    def hangs(_r, _job_id):  # the intruder's thread, still busy when the job is over
        release.wait(30)
        raise AssertionError("never judged")

    def raises(_r, _job_id):
        raise KeyError("a drill's own bug")

    def checks(_r, _job_id):
        return lambda report: DrillOutcome("link-flap", True, {}, "ok")

    monkeypatch.setitem(command.DURING_JOB, "foreign-kit", hangs)
    monkeypatch.setitem(command.DURING_JOB, "link-loss", raises)
    monkeypatch.setitem(command.DURING_JOB, "link-flap", checks)
    try:
        found = command.run_during_job(None, "job", ["link-flap", "foreign-kit", "link-loss"], thread_timeout=0.5)
    finally:
        release.set()
    outcomes = {n: judge(check, n, {}) for n, check in found.items()}
    assert list(outcomes) == ["link-flap", "foreign-kit", "link-loss"]
    assert outcomes["link-flap"].passed
    assert not outcomes["foreign-kit"].passed and "did not finish within 0 s" in outcomes["foreign-kit"].detail
    assert not outcomes["link-loss"].passed and "KeyError" in outcomes["link-loss"].detail


def test_a_check_that_raises_fails_its_own_drill_only():
    from feddg.rehearsal.outcomes import judge

    outcome = judge(lambda report: report["history"], "exposure", {})
    assert not outcome.passed and outcome.name == "exposure" and "KeyError" in outcome.detail


def test_every_declared_drill_has_its_drill_in_the_declared_order():
    """The options (import-light, for --help) and the command that runs the drills name the same drills."""
    from feddg.rehearsal import command
    from feddg.rehearsal.options import AFTER_JOB_DRILLS, DRILLS, DURING_JOB_DRILLS

    assert tuple(command.DURING_JOB) == DURING_JOB_DRILLS and tuple(command.AFTER_JOB) == AFTER_JOB_DRILLS
    assert set(command.INTRUDER_DRILLS) <= set(DURING_JOB_DRILLS) and len(set(DRILLS)) == len(DRILLS)


def test_a_resumed_jobs_history_is_its_own_not_the_copy_it_started_from(tmp_path):
    import json

    from feddg.rehearsal.drills.server_restart import history_rounds
    from feddg.resume import RESUME_DIR

    copy = tmp_path / "app" / "config" / RESUME_DIR / "history.json"  # what resume-job put in the job
    copy.parent.mkdir(parents=True)
    copy.write_text(json.dumps({"history": [{"round": r} for r in range(2)]}))
    assert history_rounds(tmp_path, "history.json") is None  # the job wrote none of its own
    written = tmp_path / "workspace" / "history.json"
    written.parent.mkdir()
    written.write_text(json.dumps({"history": [{"round": r, "weights": {}} for r in range(4)]}))
    assert history_rounds(tmp_path, "history.json") == [0, 1, 2, 3]
    written.write_text(json.dumps({"rounds": 4}))
    with pytest.raises(ValueError, match=f"{written}: no round history"):
        history_rounds(tmp_path, "history.json")
