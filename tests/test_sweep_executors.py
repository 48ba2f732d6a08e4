"""The sweep's executors without training: their options refused in one line before any run, the local executor's
runs at once (cores and GPUs shared out, a stop signal, a lost port) with a fake simulator, and the seam's rules."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from feddg.benchmark import launch
from feddg.benchmark import sweep as sweep_module
from feddg.benchmark.executors import add_executor_arguments, executor_from_args
from feddg.benchmark.executors.base import Outcome
from feddg.benchmark.executors.local import LocalExecutor, gpu_of_slot, visible_gpus
from feddg.benchmark.executors.ray_cluster import RayExecutor, pack, unpack
from feddg.benchmark.protocol import Protocol
from feddg.benchmark.signals import Interrupted
from feddg.cli import main
from feddg.compute import CONCURRENT_RUNS_ENV, ThreadBudgetError, available_cores, concurrent_runs_from_env
from feddg.numerics import cpu_model
from feddg.process_tree import alive
from tests.imports import heavy_imports

TINY = {"train": {"rounds": 2, "local_epochs": 1}, "data": {"image_size": 32}}
SWEEP = ["benchmark", "--task", "fundus", "--methods", "fedavg", "--held-out", "Domain1", "--seeds", "0-1",
         "--set", "train.rounds=2"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_bad_executor_options_are_refused_in_one_line_before_any_run(tmp_path, capsys):
    cores = available_cores()
    for args, message in [
            (["--parallel", "0"], "--parallel 0: give the number of runs at once, 1 or more"),
            (["--parallel", str(cores + 1)], f"--parallel {cores + 1}: more runs at once than this host's {cores} "
                                             f"core(s); give at most {cores}"),
            (["--executor", "ray"], "--executor ray needs --ray-address: the cluster's head as HOST:PORT, or auto"),
            (["--executor", "ray", "--ray-address", "h:1", "--max-retries", "-1"], "--max-retries -1: give 0 or more"),
            (["--executor", "ray", "--ray-address", f"127.0.0.1:{_free_port()}"], "does not answer")]:
        code = main([*SWEEP, "--out", str(tmp_path / "out"), *args])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and message in err[0], (args, err)
        # A refusal writes nothing: no run folder, and no sweep.json that would lock the folder to a protocol that
        # never ran (the unreachable cluster is refused after the plan, when the folder had been made).
        assert not (tmp_path / "out").exists(), (args, sorted((tmp_path / "out").rglob("*")))
    for value, message in [("0", "'0': give a positive number"), ("nan", "'nan': give a finite number")]:
        with pytest.raises(SystemExit):  # the option's type: argparse's usage line, then the refusal
            main([*SWEEP, "--out", str(tmp_path / "out"), "--executor", "ray", "--ray-address", "h:1",
                  "--cpus-per-run", value])
        assert f"argument --cpus-per-run: {message}" in capsys.readouterr().err


def test_the_options_module_imports_neither_torch_nvflare_nor_ray():
    code = ("import argparse; from feddg.benchmark.executors import add_executor_arguments; "
            "add_executor_arguments(argparse.ArgumentParser())")
    assert heavy_imports(code) == []


def test_each_executor_is_built_from_its_own_options():
    import argparse

    parser = argparse.ArgumentParser()
    add_executor_arguments(parser)
    local = executor_from_args(parser.parse_args([]))
    assert isinstance(local, LocalExecutor) and local.parallel == 1
    ray = executor_from_args(parser.parse_args(["--executor", "ray", "--ray-address", "auto", "--cpus-per-run", "3",
                                                "--gpus-per-run", "1", "--max-retries", "4"]))
    assert isinstance(ray, RayExecutor) and (ray.address, ray.cpus_per_run, ray.gpus_per_run, ray.max_retries) == (
        "auto", 3, 1, 4)


def test_gpus_are_given_out_one_per_run_slot_and_the_cpu_without_any():
    assert [gpu_of_slot(slot, ["0", "1"], []) for slot in range(4)] == ["0", "1", "0", "1"]
    assert gpu_of_slot(0, [], []) is None, "no GPU: the CPU"
    assert gpu_of_slot(1, ["0", "1"], ["-gpu", "1"]) is None, "the protocol's own -gpu is left alone"
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,5"}) == ["2", "5"], "the host's own ids, for NVFlare's -gpu"
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == [] and visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}) == []
    assert launch.with_gpu(["-t", "3"], "1") == ["-t", "3", "-gpu", "1"] and launch.with_gpu([], None) == []


def test_the_runs_sharing_the_host_are_read_from_the_environment_and_checked():
    assert concurrent_runs_from_env({}) == 1 and concurrent_runs_from_env({CONCURRENT_RUNS_ENV: "3"}) == 3
    for bad in ("0", "two"):
        with pytest.raises(ThreadBudgetError, match=f"{CONCURRENT_RUNS_ENV}={bad!r}"):
            concurrent_runs_from_env({CONCURRENT_RUNS_ENV: bad})


def test_feddg_simulate_counts_the_site_processes_of_every_run_on_the_host(tmp_path, monkeypatch):
    from tests.test_simulate_command import JOB

    environments: list = []

    def execv(path, command):
        environments.append(dict(os.environ))
        raise SystemExit(0)

    monkeypatch.setattr(os, "execv", execv)
    monkeypatch.setenv(CONCURRENT_RUNS_ENV, "2")
    with pytest.raises(SystemExit):
        main(["simulate", str(JOB), "-w", str(tmp_path / "ws"), "--", "-n", "3"])
    assert environments[0]["FEDDG_SITE_PROCESSES"] == "6", "3 sites in each of 2 runs at once"


def test_an_outcome_status_outside_the_four_is_a_programming_error(tmp_path):
    with pytest.raises(ValueError, match="Outcome.status 'done'"):
        Outcome("done", "", 0, 1.0, None, tmp_path / "log")


def test_a_job_folder_travels_to_a_worker_and_back_whole(tmp_path):
    (tmp_path / "job" / "app" / "config").mkdir(parents=True)
    (tmp_path / "job" / "app" / "config" / "feddg.yaml").write_text("train: {rounds: 2}\n")
    (tmp_path / "job" / "meta.json").write_text("{}")
    unpack(pack(tmp_path, ["job"]), tmp_path / "there")
    assert (tmp_path / "there" / "job" / "app" / "config" / "feddg.yaml").read_text() == "train: {rounds: 2}\n"
    assert (tmp_path / "there" / "job" / "meta.json").exists()


# -- the local executor with a fake simulator ----------------------------------------------------------------------

FAKE_SIMULATOR = r'''
import json, os, sys, time
job, ws, mode, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
server = os.path.join(ws, "server", "simulate_job")
os.makedirs(server, exist_ok=True)
start = time.time()
run = os.path.dirname(ws)  # the run's folder, kept after the run (its workspace is removed)
with open(os.path.join(run, "seen.json"), "w") as f:
    json.dump({"args": args, "runs": os.environ.get("FEDDG_CONCURRENT_RUNS"), "pid": os.getpid(), "start": start}, f)
if mode == "port-race" and not os.path.exists(os.path.join(run, "raced")):
    open(os.path.join(run, "raced"), "w").close()
    print("OSError: [Errno 98] Address already in use", flush=True)
    time.sleep(600)  # as NVFlare's simulator does then: it waits for ever
    sys.exit(1)
time.sleep(600 if mode == "hang" else 1.5)
with open(os.path.join(server, "feddg_report.json"), "w") as f:
    json.dump({"models": {"final": {"sites": {f"Domain{i}": {} for i in range(1, 5)}}}}, f)
with open(os.path.join(run, "end.json"), "w") as f:
    json.dump({"end": time.time()}, f)
'''


@pytest.fixture
def fake_simulator(tmp_path, monkeypatch):
    script = tmp_path / "fake_simulator.py"
    script.write_text(FAKE_SIMULATOR)
    state = {"mode": "ok"}

    def command(job, workspace, simulator_args):
        return [sys.executable, str(script), str(job), str(workspace), state["mode"], *simulator_args]

    monkeypatch.setattr(launch, "simulate_command", command)
    monkeypatch.setattr(launch, "POLL_S", 0.05)
    return state


def _seen(out: Path, run_id: str, name: str = "seen.json") -> dict:
    return json.loads((out / "runs" / run_id / name).read_text())


def test_two_runs_go_at_once_each_with_its_gpu_and_told_that_they_share_the_host(tmp_path, fake_simulator):
    out = tmp_path / "out"
    records = sweep_module.sweep(out, Protocol("fundus", TINY), ["fedavg"], ["Domain1"], [0, 1, 2],
                                 report=lambda _: None, executor=LocalExecutor(parallel=2, gpus=["0", "1"], cores=2))
    assert [r["status"] for r in records] == ["ok"] * 3
    assert [r["executor"]["gpu"] for r in records[:2]] == ["0", "1"], "slot 0, then slot 1"
    # The third run takes the slot freed first (slot 0 unless, on a loaded host, run 1 ended before run 0).
    freed = next(r for r in records[:2] if r["executor"]["gpu"] == records[2]["executor"]["gpu"])
    assert _seen(out, freed["run_id"], "end.json")["end"] <= _seen(out, records[2]["run_id"])["start"], \
        "the third run took a slot whose run had ended"
    assert all(r["executor"] == {**r["executor"], "executor": "local", "parallel": 2, "attempts": 1} for r in records)
    assert {r["executor"]["cpu"] for r in records} == {cpu_model()}, "the CPU model that made each run"
    assert not (out / "runs" / records[0]["run_id"] / "ws").exists(), "a finished run's workspace is removed"


def test_runs_at_once_overlap_in_time_and_see_the_gpu_flag(tmp_path, fake_simulator):
    out = tmp_path / "out"
    sweep_module.sweep(out, Protocol("fundus", TINY), ["fedavg"], ["Domain1"], [0, 1], report=lambda _: None,
                       executor=LocalExecutor(parallel=2, gpus=["3"], cores=2))
    first, second = (_seen(out, f"fundus_fedavg_Domain1_seed{k}") for k in (0, 1))
    end_first = _seen(out, "fundus_fedavg_Domain1_seed0", "end.json")["end"]
    assert second["start"] < end_first, "the second run started before the first ended"
    assert first["runs"] == second["runs"] == "2"
    assert first["args"][-2:] == ["-gpu", "3"] and second["args"][-2:] == ["-gpu", "3"]


def test_a_stop_signal_stops_every_run_at_once_and_records_each_as_interrupted(tmp_path, fake_simulator):
    out = tmp_path / "out"
    fake_simulator["mode"] = "hang"
    pids: list[int] = []

    def signal_when_both_run() -> None:
        deadline = time.monotonic() + 60
        files = [out / "runs" / f"fundus_fedavg_Domain1_seed{k}" / "seen.json" for k in (0, 1)]
        while not all(f.exists() for f in files) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        pids.extend(json.loads(f.read_text())["pid"] for f in files)
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=signal_when_both_run, daemon=True)
    thread.start()
    try:
        with pytest.raises(Interrupted) as stopped:
            sweep_module.sweep(out, Protocol("fundus", TINY), ["fedavg"], ["Domain1"], [0, 1, 2],
                               report=lambda _: None, executor=LocalExecutor(parallel=2, gpus=[], cores=2))
        thread.join(5)
        assert stopped.value.stopped == ("fundus_fedavg_Domain1_seed0", "fundus_fedavg_Domain1_seed1")
        assert "fundus_fedavg_Domain1_seed0 and fundus_fedavg_Domain1_seed1 were stopped with every process they " \
               "started and recorded as interrupted (the same command runs them again)" in str(stopped.value)
        assert pids and not any(alive(pid) for pid in pids)
        for k in (0, 1):
            record = json.loads((out / "runs" / f"fundus_fedavg_Domain1_seed{k}" / "run.json").read_text())
            assert record["status"] == "interrupted" and record["reason"].startswith("stopped by SIGINT after")
        assert not (out / "runs" / "fundus_fedavg_Domain1_seed2").exists(), "a cell never started leaves nothing"
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_run_that_lost_a_port_is_run_once_more_and_counts_its_attempts(tmp_path, fake_simulator):
    fake_simulator["mode"] = "port-race"
    lines: list[str] = []
    begun = time.monotonic()
    records = sweep_module.sweep(tmp_path / "out", Protocol("fundus", TINY), ["fedavg"], ["Domain1"], [0],
                                 report=lines.append, executor=LocalExecutor(parallel=1, gpus=[], cores=2))
    assert time.monotonic() - begun < 120, "stopped on the race's line, not at the run's time limit"
    assert records[0]["status"] == "ok" and records[0]["executor"]["attempts"] == 2
    assert any("lost a port to another process (Address already in use)" in line and
               line.endswith("running it again") for line in lines)
