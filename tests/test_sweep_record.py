"""A results folder's record is checked, not trusted; its sweep's lifecycle (signals, timeouts, failures) and its
lock; all without training: runs are recorded by a fake executor or run by a fake simulator command."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from feddg.benchmark import launch
from feddg.benchmark import sweep as sweep_module
from feddg.benchmark.protocol import Protocol, Run, run_experiment
from feddg.benchmark.record import LOCK_FILE, RUN_FILE, SWEEP_FILE
from feddg.benchmark.signals import Interrupted
from feddg.config import ConfigError
from feddg.process_tree import alive
from feddg.report import code_fingerprint, sites_absent
from tests.fake_executor import FakeExecutor
from tests.conftest import REPOSITORY

TINY = {"train": {"rounds": 2, "local_epochs": 1}, "data": {"image_size": 32}}
SITE = "Domain1"
CODE = code_fingerprint()


def _quiet(_: str) -> None:
    pass


def _use(monkeypatch, executor: FakeExecutor) -> None:
    """The sweep's default executor is ``executor``."""
    monkeypatch.setattr(sweep_module, "LocalExecutor", lambda: executor)


def _sweep(out: Path, protocol: Protocol, seeds=(0, 1), methods=("fedavg",), **kw) -> list[dict]:
    return sweep_module.sweep(out, protocol, list(methods), [SITE], list(seeds), report=kw.pop("report", _quiet), **kw)


@pytest.fixture
def ran(monkeypatch) -> list:
    runs: list = []
    _use(monkeypatch, FakeExecutor(runs))
    return runs


# -- the protocol: rebuilt from the runs, never replaced by a new command line --------------------------------------


def test_a_missing_sweep_json_is_rebuilt_from_the_runs_and_a_new_command_line_is_refused(tmp_path, ran):
    _sweep(tmp_path, Protocol("fundus", TINY))
    (tmp_path / SWEEP_FILE).unlink()
    other = Protocol("fundus", {"train": {"rounds": 7, "local_epochs": 1, "lr": 0.5}, "data": {"image_size": 32}})
    with pytest.raises(ConfigError, match=r"sweep.json \(it is missing: rebuilt from the folder's 2 run\(s\)\): this "
                                          r"results folder holds another protocol: train.lr: 0.001 in this folder, "
                                          r"0.5 in this sweep"):
        _sweep(tmp_path, other, seeds=(0, 1, 2))
    assert not (tmp_path / SWEEP_FILE).exists() and len(ran) == 2  # refused: nothing written, nothing run

    lines: list[str] = []
    _sweep(tmp_path, Protocol("fundus", TINY), seeds=(0, 1, 2), report=lines.append)
    assert any("it is missing: rebuilt from the folder's 2 run(s)" in line for line in lines)
    rebuilt = json.loads((tmp_path / SWEEP_FILE).read_text())
    assert rebuilt["overrides"] == TINY and rebuilt["task"] == "fundus" and rebuilt["simulator_args"] == []
    assert "rebuilt_from_runs" in rebuilt and ran[-1] == "fundus_fedavg_Domain1_seed2"


@pytest.mark.parametrize("damage", ["truncated", "no protocol"])
def test_a_damaged_sweep_json_is_rebuilt_keeping_its_code_evidence(tmp_path, ran, damage):
    _sweep(tmp_path, Protocol("fundus", TINY))
    path = tmp_path / SWEEP_FILE
    evidence = [{"run_id": "fundus_fedavg_Domain1_seed0", "from_code": "a", "to_code": "b", "identical": True}]
    path.write_text(path.read_text()[:25] if damage == "truncated" else json.dumps({"code_evidence": evidence}))
    with pytest.raises(ConfigError, match="it is damaged: rebuilt .* data.image_size: 32 in this folder, 64 in this"):
        _sweep(tmp_path, Protocol("fundus", {"train": {"rounds": 2, "local_epochs": 1}}))
    _sweep(tmp_path, Protocol("fundus", TINY))
    rebuilt = json.loads(path.read_text())
    assert rebuilt["overrides"] == TINY
    assert rebuilt.get("code_evidence") == (evidence if damage == "no protocol" else None)


def test_the_design_is_every_cell_an_accepted_sweep_asked_for(tmp_path, ran):
    from feddg.benchmark.record import designed

    _sweep(tmp_path, Protocol("fundus", TINY))
    _sweep(tmp_path, Protocol("fundus", TINY), seeds=(2,), methods=("uniform",))
    design = {"fedavg": {SITE: [0, 1]}, "uniform": {SITE: [2]}}
    assert designed(tmp_path) == design, "the exact cells asked for, not the product of their unions"
    with pytest.raises(ConfigError, match="holds another protocol"):
        _sweep(tmp_path, Protocol("fundus", {**TINY, "train": {"rounds": 7, "local_epochs": 1}}), methods=("ga",))
    records = {path: path.read_text() for path in sorted(tmp_path.glob(f"runs/*/{RUN_FILE}"))}
    for path, text in records.items():  # made by other code: refused after the protocol and records are checked
        path.write_text(json.dumps({**json.loads(text), "code": "other"}))
    with pytest.raises(ConfigError, match="A results folder holds one code version"):
        _sweep(tmp_path, Protocol("fundus", TINY), seeds=(3,))
    assert designed(tmp_path) == design, "a refused sweep leaves the design as it was"
    for path, text in records.items():
        path.write_text(text)

    path = tmp_path / SWEEP_FILE
    path.write_text(json.dumps({"design": design}))  # the protocol lost, the design readable: kept on rebuild
    _sweep(tmp_path, Protocol("fundus", TINY), seeds=(0,))
    assert designed(tmp_path) == design
    path.unlink()  # lost with the file: started again from the runs' cells
    _sweep(tmp_path, Protocol("fundus", TINY), seeds=(4,), methods=("uniform",))
    assert designed(tmp_path) == {"fedavg": {SITE: [0, 1]}, "uniform": {SITE: [2, 4]}}


def _write_record(out: Path, protocol: Protocol, run: Run, **changes) -> None:
    record = {"run": run.__dict__, "run_id": run.run_id, "status": "ok", "wall_s": 1.0, "code": CODE,
              "config": run_experiment(protocol, run), "simulator_args": list(protocol.simulator_args), **changes}
    (out / "runs" / run.run_id).mkdir(parents=True, exist_ok=True)
    (out / "runs" / run.run_id / RUN_FILE).write_text(json.dumps(record))


def test_runs_that_cannot_show_one_protocol_leave_a_missing_sweep_json_refused(tmp_path, ran):
    one, other = Run("fundus", "fedavg", SITE, 0), Run("fundus", "fedavg", SITE, 1)
    _write_record(tmp_path, Protocol("fundus", TINY), one)
    _write_record(tmp_path, Protocol("fundus", {**TINY, "train": {"rounds": 2, "local_epochs": 1, "lr": 0.5}}), other)
    with pytest.raises(ConfigError, match=r"sweep.json is missing and cannot be rebuilt from the folder's 2 run\(s\): "
                                          r"its runs disagree on train.lr: 0.001 in fundus_fedavg_Domain1_seed0, 0.5 "
                                          r"in another run"):
        _sweep(tmp_path, Protocol("fundus", TINY))
    _write_record(tmp_path, Protocol("fundus", TINY), other, simulator_args=None)
    with pytest.raises(ConfigError, match="seed1 does not record its simulator flags"):
        _sweep(tmp_path, Protocol("fundus", TINY))
    _write_record(tmp_path, Protocol("fundus", TINY, ["-t", "1"]), other)
    with pytest.raises(ConfigError, match=r'different simulator flags: \["-t", "1"\], \[\]'):
        _sweep(tmp_path, Protocol("fundus", TINY))
    assert ran == []


@pytest.mark.parametrize("key, value, option", [
    ("train.seed", 5, "--seeds"), ("mla.encoder_seed", 3, "--seeds"), ("data.unseen_site", "Domain2", "--held-out"),
    ("data.task", "prostate", "--task")])
def test_settings_the_sweep_sets_for_each_run_are_refused_in_set(tmp_path, ran, key, value, option):
    section, name = key.split(".")
    with pytest.raises(ConfigError, match=f"--set {key}: the sweep sets it for each run from {option}"):
        _sweep(tmp_path, Protocol("fundus", {**TINY, section: {**TINY.get(section, {}), name: value}}))
    assert not tmp_path.joinpath(SWEEP_FILE).exists() and ran == []


# -- every run's own config is checked -------------------------------------------------------------------------


def test_a_run_copied_in_from_another_protocol_is_refused_by_name_or_moved_aside(tmp_path, ran):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    _sweep(out, Protocol("fundus", TINY), seeds=(0,))
    _sweep(elsewhere, Protocol("fundus", {**TINY, "data": {"image_size": 48}}), seeds=(1,))
    shutil.copytree(elsewhere / "runs" / "fundus_fedavg_Domain1_seed1", out / "runs" / "fundus_fedavg_Domain1_seed1")
    with pytest.raises(ConfigError, match=r"1 run\(s\) were not made under this folder's protocol, first "
                                          r"fundus_fedavg_Domain1_seed1: data.image_size: 48 in the run, 32 under "
                                          r"this folder's protocol; use another --out, or --move-aside-mismatched"):
        _sweep(out, Protocol("fundus", TINY))
    lines: list[str] = []
    _sweep(out, Protocol("fundus", TINY), dry_run=True, move_aside=True, report=lines.append)
    assert lines[0].startswith("would move fundus_fedavg_Domain1_seed1 to aside/ (data.image_size: 48 in the run")
    assert ran == ["fundus_fedavg_Domain1_seed0", "fundus_fedavg_Domain1_seed1"]  # the two folders' own runs
    _sweep(out, Protocol("fundus", TINY), move_aside=True, report=lines.append)
    assert (out / "aside" / "fundus_fedavg_Domain1_seed1" / RUN_FILE).exists()
    assert ran[-1] == "fundus_fedavg_Domain1_seed1", "moved aside, it is run under this folder's protocol"
    assert json.loads((out / "runs" / "fundus_fedavg_Domain1_seed1" / RUN_FILE).read_text())["config"]["data"][
        "image_size"] == 32


@pytest.mark.parametrize("damage, message", [
    ("renamed", "fundus_fedavg_Domain1_seed5: its run.json is of run fundus_fedavg_Domain1_seed0"),
    ("other task", "prostate_fedavg_Domain1_seed0: a prostate run in a fundus folder"),
    ("no config", r"fundus_fedavg_Domain1_seed0/run.json: no 'config'; a run record holds"),
    ("other flags", r'seed0: simulator flags \["-t", "1"\] in the run, \[\] in this folder'),
])
def test_a_run_record_that_does_not_fit_its_folder_is_refused(tmp_path, ran, damage, message):
    _sweep(tmp_path, Protocol("fundus", TINY), seeds=(0,))
    folder = tmp_path / "runs" / "fundus_fedavg_Domain1_seed0"
    record = json.loads((folder / RUN_FILE).read_text())
    if damage == "renamed":
        folder.rename(folder.with_name("fundus_fedavg_Domain1_seed5"))
    elif damage == "other task":
        record["run"]["task"] = "prostate"
        folder = folder.rename(folder.with_name("prostate_fedavg_Domain1_seed0"))
    elif damage == "no config":
        del record["config"]
    else:
        record["simulator_args"] = ["-t", "1"]
    if damage != "renamed":
        (folder / RUN_FILE).write_text(json.dumps(record))
    with pytest.raises(ConfigError, match=message):
        _sweep(tmp_path, Protocol("fundus", TINY), seeds=(0,))


def test_an_interrupted_run_runs_again_without_retry_failed_and_is_no_result(tmp_path, monkeypatch):
    from feddg.benchmark.scores import load_records

    ran: list = []
    _use(monkeypatch, FakeExecutor(ran, status="interrupted"))
    _sweep(tmp_path, Protocol("fundus", TINY), seeds=(0,))
    _use(monkeypatch, FakeExecutor(ran, status="failed"))
    _sweep(tmp_path, Protocol("fundus", TINY), seeds=(0, 1))
    assert load_records(tmp_path) != [] and ran == ["fundus_fedavg_Domain1_seed0"] * 2 + ["fundus_fedavg_Domain1_seed1"]
    _sweep(tmp_path, Protocol("fundus", TINY), seeds=(0, 1))  # failed runs stay failed without --retry-failed
    assert len(ran) == 3
    (tmp_path / "runs" / "fundus_fedavg_Domain1_seed1" / RUN_FILE).write_text(
        (tmp_path / "runs" / "fundus_fedavg_Domain1_seed1" / RUN_FILE).read_text().replace('"failed"', '"interrupted"'))
    assert [r["run_id"] for r in load_records(tmp_path)] == ["fundus_fedavg_Domain1_seed0"]


def test_a_report_without_every_site_is_named():
    """The first round aggregated without a training site, or the unseen site missing from the final evaluation."""
    final = {"models": {"final": {"sites": {"Domain1": {}, "Domain2": {}}}}}
    sites = ["Domain1", "Domain2", "Domain3"]
    rounds = [{"round": 0, "sites": ["Domain2", "Domain3"]}, {"round": 1, "sites": ["Domain3"]}]
    assert sites_absent({**final, "history": rounds}, sites, "Domain1") == "round 1 aggregated without Domain2"
    assert sites_absent({**final, "history": rounds[:1]}, sites, "Domain1") is None
    assert sites_absent({**final, "history": rounds[:1]}, sites, "Domain3") == \
        "round 0 aggregated without Domain1"
    assert sites_absent({"history": rounds[:1]}, sites, "Domain1") == \
        "the final model was not evaluated at the unseen site Domain1"


@pytest.mark.parametrize("rounds, status", [
    ([{"round": 0, "sites": ["Domain2", "Domain3", "Domain4"]}], "ok"),
    ([{"round": 0, "sites": ["Domain2", "Domain3", "Domain4"]}, {"round": 1, "sites": ["Domain2", "Domain4"]}],
     "failed"),
])
def test_a_run_that_ends_without_every_site_is_recorded_as_failed_naming_it(tmp_path, monkeypatch, rounds, status):
    """A site's process that never asks for its tasks leaves rounds aggregated without it (NVFlare's simulator could
    name two processes after one site): such a run is no protocol run, and its record says which round lacked whom."""
    _use(monkeypatch, FakeExecutor([], scores=(0.8,), history=rounds))
    _sweep(tmp_path, Protocol("fundus", TINY), seeds=(0,))
    record = json.loads((tmp_path / "runs" / "fundus_fedavg_Domain1_seed0" / RUN_FILE).read_text())
    assert record["status"] == status
    if status == "failed":
        assert record["reason"] == "the run ended without every site: round 1 aggregated without Domain3"


def test_every_committed_run_had_every_site():
    """Every finished run of the committed results: each round aggregated every training site and the unseen site
    was evaluated (a run hit by the simulator's site-name race could not have both)."""
    runs = sorted((REPOSITORY / "benchmarks" / "results").glob("**/runs/*/run.json"))
    checked = 0
    for path in runs:
        record = json.loads(path.read_text())
        if record.get("status") == "ok" and record.get("report", {}).get("history"):
            absent = sites_absent(record["report"], record["config"]["data"]["sites"], record["run"]["held_out"])
            assert absent is None, f"{path}: {absent}"
            checked += 1
    assert checked >= 300, checked


# -- one sweep per folder ------------------------------------------------------------------------------------------


def _lock(out: Path, pid, host: str | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / LOCK_FILE).write_text(json.dumps({"pid": pid, "host": host or socket.gethostname(), "since": "then"}))


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_folder_takes_one_sweep_at_a_time(tmp_path, ran):
    holder = os.getppid()  # a process that runs
    _lock(tmp_path, holder)
    with pytest.raises(ConfigError, match=f"is in use by another sweep \\(pid {holder} on host "
                                          f"{socket.gethostname()}, since then\\): one sweep works on a folder"):
        _sweep(tmp_path, Protocol("fundus", TINY))
    assert ran == [] and not (tmp_path / "runs").exists()
    _sweep(tmp_path, Protocol("fundus", TINY), dry_run=True)  # a dry run takes no lock
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == holder

    _lock(tmp_path, holder, host="elsewhere")
    with pytest.raises(ConfigError, match="on host elsewhere.*cannot be checked from here: remove"):
        _sweep(tmp_path, Protocol("fundus", TINY))
    (tmp_path / LOCK_FILE).write_text("{")
    with pytest.raises(ConfigError, match=f"{LOCK_FILE} cannot be read: a sweep may be working on"):
        _sweep(tmp_path, Protocol("fundus", TINY))

    dead = _dead_pid()
    _lock(tmp_path, dead)
    lines: list[str] = []
    _sweep(tmp_path, Protocol("fundus", TINY), report=lines.append)
    assert f"was left by pid {dead} on {socket.gethostname()}, which no longer runs; taking it over" in lines[0]
    assert len(ran) == 2 and not (tmp_path / LOCK_FILE).exists(), "released after the sweep"


def test_the_lock_is_released_when_a_run_raises(tmp_path, monkeypatch):
    _use(monkeypatch, FakeExecutor([], error=OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        _sweep(tmp_path, Protocol("fundus", TINY))
    assert not (tmp_path / LOCK_FILE).exists()


# -- the run lifecycle, with a fake simulator ----------------------------------------------------------------------


FAKE_SIMULATOR = r'''
import json, os, signal, subprocess, sys, time
ws, mode = sys.argv[1], sys.argv[2]
os.makedirs(ws, exist_ok=True)
if mode == "fail":
    sys.exit(3)
if mode == "finish-then-signal":
    server = os.path.join(ws, "server", "simulate_job")
    os.makedirs(server)
    with open(os.path.join(server, "feddg_report.json"), "w") as f:
        json.dump({"models": {"final": {"sites": {f"Domain{i}": {} for i in range(1, 5)}}}}, f)
    os.kill(os.getppid(), signal.SIGINT)
    sys.exit(0)
# a site worker, as NVFlare starts it: in a session of its own
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
with open(os.path.join(ws, "pids.json.tmp"), "w") as f:
    json.dump([os.getpid(), worker.pid], f)
os.replace(os.path.join(ws, "pids.json.tmp"), os.path.join(ws, "pids.json"))
time.sleep(600)
'''


@pytest.fixture
def fake_simulator(tmp_path, monkeypatch):
    """Runs use the fake simulator above; returns a setter for its mode and the list of process ids it started."""
    script = tmp_path / "fake_simulator.py"
    script.write_text(FAKE_SIMULATOR)
    state = {"mode": "hang", "pids": []}

    def command(job, workspace, simulator_args):
        return [sys.executable, str(script), str(workspace), state["mode"]]

    monkeypatch.setattr(launch, "simulate_command", command)
    monkeypatch.setattr(launch, "POLL_S", 0.1)
    yield state
    for pid in state["pids"]:  # never left behind, even by a failing test
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def _signal_when_running(out: Path, state: dict, signum: int) -> threading.Thread:
    """Send ``signum`` to this process once the fake simulator of the first run has started its worker."""
    pids_file = out / "runs" / "fundus_fedavg_Domain1_seed0" / "ws" / "pids.json"

    def wait_and_signal() -> None:
        deadline = time.monotonic() + 60
        while not pids_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        state["pids"] = json.loads(pids_file.read_text())
        os.kill(os.getpid(), signum)

    thread = threading.Thread(target=wait_and_signal, daemon=True)
    thread.start()
    return thread


def test_sigint_stops_the_run_with_every_process_it_started_and_records_it_as_interrupted(tmp_path, fake_simulator):
    before = signal.getsignal(signal.SIGINT)
    thread = _signal_when_running(tmp_path, fake_simulator, signal.SIGINT)
    with pytest.raises(Interrupted) as stopped:
        _sweep(tmp_path, Protocol("fundus", TINY))
    thread.join(5)
    assert stopped.value.exit_code == 130 and stopped.value.stopped == ("fundus_fedavg_Domain1_seed0",)
    assert str(stopped.value).startswith("interrupted by SIGINT: fundus_fedavg_Domain1_seed0 was stopped with every")
    simulator, worker = fake_simulator["pids"]
    assert not alive(simulator) and not alive(worker), "the worker in its own session is stopped too"
    record = json.loads((tmp_path / "runs" / "fundus_fedavg_Domain1_seed0" / RUN_FILE).read_text())
    assert record["status"] == "interrupted" and record["reason"].startswith("stopped by SIGINT after")
    assert not (tmp_path / "runs" / "fundus_fedavg_Domain1_seed1").exists(), "the sweep ended there"
    assert not (tmp_path / "runs" / "fundus_fedavg_Domain1_seed0" / "ws").exists()
    assert signal.getsignal(signal.SIGINT) is before and not (tmp_path / LOCK_FILE).exists()


def test_sigterm_ends_the_benchmark_command_with_143_and_one_line(tmp_path, fake_simulator, capsys):
    from feddg.cli import main

    out = tmp_path / "out"
    thread = _signal_when_running(out, fake_simulator, signal.SIGTERM)
    code = main(["benchmark", "--task", "fundus", "--methods", "fedavg", "--held-out", SITE, "--seeds", "0-1",
                 "--set", "train.rounds=2", "--out", str(out)])
    thread.join(5)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 143 and err == ["feddg benchmark: interrupted by SIGTERM: fundus_fedavg_Domain1_seed0 was stopped "
                                   "with every process it started and recorded as interrupted (the same command runs "
                                   "it again)"]
    assert not any(alive(pid) for pid in fake_simulator["pids"])


def test_a_run_that_finished_before_the_signal_keeps_its_record(tmp_path, fake_simulator):
    fake_simulator["mode"] = "finish-then-signal"
    with pytest.raises(Interrupted) as stopped:
        _sweep(tmp_path, Protocol("fundus", TINY))
    assert stopped.value.stopped == () and str(stopped.value) == (
        "interrupted by SIGINT: no run was stopped; the finished runs keep their records")
    record = json.loads((tmp_path / "runs" / "fundus_fedavg_Domain1_seed0" / RUN_FILE).read_text())
    assert record["status"] == "ok" and record["report"]["models"]["final"]["sites"]["Domain1"] == {}
    assert not (tmp_path / "runs" / "fundus_fedavg_Domain1_seed1").exists()


def test_a_run_past_its_time_is_stopped_with_its_workers_and_a_failing_run_does_not_stop_the_sweep(
        tmp_path, fake_simulator):
    records = _sweep(tmp_path / "slow", Protocol("fundus", TINY), seeds=(0,), timeout=2.0)
    fake_simulator["pids"] = json.loads((tmp_path / "slow" / "runs" / "fundus_fedavg_Domain1_seed0" / "ws" /
                                         "pids.json").read_text())
    assert records[0]["status"] == "timeout" and records[0]["reason"] == "stopped after 2 s"
    assert not any(alive(pid) for pid in fake_simulator["pids"])
    fake_simulator["mode"] = "fail"
    records = _sweep(tmp_path / "failing", Protocol("fundus", TINY))
    assert [(r["status"], r["reason"]) for r in records] == [("failed", "exit code 3, no report written")] * 2


# -- real data are checked once, before any run -------------------------------------------------------------------


def test_a_data_root_one_level_too_high_is_refused_before_any_run(tmp_path, synthetic_root, ran):
    high = tmp_path / "data"
    high.mkdir()
    (high / "Fundus").symlink_to(synthetic_root["fundus"])
    protocol = Protocol("fundus", {**TINY, "data": {"image_size": 32, "root": str(high), "layout": "dofe_png"}})
    with pytest.raises(ConfigError, match=r"found 4 problem\(s\), so no run was started: site Domain1: .*missing"):
        _sweep(tmp_path / "out", protocol)
    assert ran == [] and not (tmp_path / "out").exists()


def test_the_data_are_checked_and_the_training_size_is_said_when_the_images_are_larger(tmp_path, synthetic_root,
                                                                                         ran):
    protocol = Protocol("fundus", {**TINY, "data": {"image_size": 16, "root": str(synthetic_root["fundus"]),
                                                     "layout": "dofe_png"}})
    lines: list[str] = []
    _sweep(tmp_path, protocol, seeds=(0,), report=lines.append)
    assert any("the data's images are up to 32 px a side (32x32x3); the runs train at data.image_size = 16 px"
               in line for line in lines)
    assert ran == ["fundus_fedavg_Domain1_seed0"]
    lines.clear()
    _sweep(tmp_path, protocol, seeds=(0,), report=lines.append)  # nothing to run: no data check
    assert not any("data" in line for line in lines)


def test_the_stop_message_names_every_stopped_run():
    assert str(Interrupted(signal.SIGINT, ("a",))) == ("interrupted by SIGINT: a was stopped with every process it "
                                                       "started and recorded as interrupted (the same command runs "
                                                       "it again)")
    assert "a, b and c were stopped with every process they started" in str(Interrupted(signal.SIGTERM, ("a", "b", "c")))


@pytest.mark.parametrize("change, message", [
    ({"run_id": None}, "'run_id' is NoneType None, not str"),
    ({"wall_s": -1.0}, "'wall_s' is -1.0; a wall time is a finite number >= 0"),
    ({"wall_s": float("nan")}, "'wall_s' is nan"),
    ({"wall_s": "60"}, "'wall_s' is str '60', not a number"),
    ({"run": {"task": "fundus", "method": "fedavg", "held_out": SITE}}, "no 'run.seed'"),
    ({"status": True}, "'status' is bool True, not str"),
])
def test_a_run_record_missing_a_field_is_refused_naming_the_file_and_field(tmp_path, change, message):
    """A run.json lacking a key gave a KeyError traceback in the tables; now one line names the file and field."""
    from feddg.benchmark.record import run_records

    run = Run("fundus", "fedavg", SITE, 0)
    _write_record(tmp_path, Protocol("fundus", TINY), run)
    path = tmp_path / "runs" / run.run_id / RUN_FILE
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(ConfigError, match=re.escape(message)) as e:
        run_records(tmp_path)
    assert f"{run.run_id}/{RUN_FILE}" in str(e.value)


def test_a_finished_run_without_its_report_is_refused_by_the_tables(tmp_path):
    from feddg.benchmark.scores import load_records

    _write_record(tmp_path, Protocol("fundus", TINY), Run("fundus", "fedavg", SITE, 0))
    with pytest.raises(ConfigError, match="run.json: no 'report'"):
        load_records(tmp_path)


def test_a_result_file_never_holds_nan(tmp_path):
    from feddg.jsonfile import write_json

    with pytest.raises(ValueError, match=r"results.json: not written: .*no NaN or Infinity"):
        write_json(tmp_path / "results.json", {"hours": float("nan")}, finite=True)
    with pytest.raises(ValueError, match="not written"):
        write_json(tmp_path / "results.json", {"hours": [float("-inf")]}, finite=True)
    assert list(tmp_path.iterdir()) == []
