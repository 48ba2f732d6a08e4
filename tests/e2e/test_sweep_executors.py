"""The sweep's executors end to end on a tiny fundus protocol: two local runs at once give the same per-case scores
as one at a time, each told that the host's cores are shared; and a real two-node Ray cluster on loopback runs a
tiny sweep across both nodes, one node killed mid-run and its run retried on the other, whole."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from feddg.benchmark.protocol import Protocol
from feddg.benchmark.sweep import sweep
from feddg.benchmark.reproduce import case_scores_of
from feddg.cli import main
from feddg.compute import SITE_PROCESSES_ENV, available_cores
from feddg.process_tree import kill_tree
from tests.conftest import TINY_HELD_OUT_CASES, as_sets, tiny_overrides

pytestmark = pytest.mark.slow

TINY_OVERRIDES = tiny_overrides("fundus", TINY_HELD_OUT_CASES, rounds=2, local_epochs=1)
TINY = as_sets(TINY_OVERRIDES)
SWEEP = ["benchmark", "--task", "fundus", "--methods", "fedavg", "--held-out", "Domain1", "--seeds", "0-1",
         "--resamples", "100", "--run-timeout", "600", *TINY]


def _records(out: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(out.glob("runs/*/run.json"))}


def _evidence(record: dict) -> str:
    """What a differing run's record says about how it ran: the splits each site's final evaluation answered with,
    the executor's attempts, and its log's lines on answers from another run's process."""
    splits = {site: sorted(entry["splits"]) for site, entry in record["report"]["models"]["final"]["sites"].items()}
    log = Path(record["log"]).read_text(errors="replace").splitlines()
    foreign = [line[-300:] for line in log if "another run" in line]
    return f"final splits {splits}, attempts {record['executor']['attempts']}, other-run lines {foreign[:4]}"


def _site_processes(log: str) -> int:
    prefix = f"running NVFlare's simulator: {SITE_PROCESSES_ENV}="
    line = next(line for line in log.splitlines() if line.startswith(prefix))
    return int(line[len(prefix):].split()[0])


@pytest.mark.skipif(available_cores() < 2, reason="two runs at once need two cores")
def test_two_local_runs_at_once_give_the_same_per_case_scores_as_one_at_a_time(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDDG_CACHE", str(tmp_path / "cache"))
    assert main([*SWEEP, "--out", str(tmp_path / "one"), "--parallel", "1"]) == 0
    assert main([*SWEEP, "--out", str(tmp_path / "two"), "--parallel", "2"]) == 0
    one, two = _records(tmp_path / "one"), _records(tmp_path / "two")
    assert sorted(one) == sorted(two) == ["fundus_fedavg_Domain1_seed0", "fundus_fedavg_Domain1_seed1"]
    for run_id in one:
        assert one[run_id]["status"] == two[run_id]["status"] == "ok"
        cases = case_scores_of(one[run_id]["report"])
        assert cases["final"]["Domain1"]["test"], "the held-out site's per-case scores are there"
        assert case_scores_of(two[run_id]["report"]) == cases, (
            f"{run_id}: other scores with two runs at once; alone: {_evidence(one[run_id])}; two at once: "
            f"{_evidence(two[run_id])}")
        assert one[run_id]["executor"]["executor"] == "local" and one[run_id]["executor"]["parallel"] == 1
        assert two[run_id]["executor"]["parallel"] == 2 and two[run_id]["executor"]["attempts"] in (1, 2)
        # the thread budget counts every site process on the host: both runs' sites
        alone = _site_processes(Path(one[run_id]["log"]).read_text())
        assert _site_processes(Path(two[run_id]["log"]).read_text()) == 2 * alone
    results = json.loads((tmp_path / "two" / "results.json").read_text())
    assert results["machine_time"]["runs_by_executor"] == {"local": 2}
    assert "(run by local: 2)" in (tmp_path / "two" / "results.md").read_text()


# -- Ray: two nodes on loopback -------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _ray_node(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """A Ray node in the foreground (``--block``) in a session of its own, every port of its own on loopback."""
    ports = ["--node-manager-port", "--object-manager-port", "--metrics-export-port",
             "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--runtime-env-agent-port"]
    command = [str(Path(sys.executable).with_name("ray")), "start", "--block", "--num-cpus", "1", "--num-gpus", "0",
               "--disable-usage-stats", *args,
               *[x for flag in ports for x in (flag, str(_free_port()))]]
    return subprocess.Popen(command, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


@pytest.fixture
def ray_cluster(tmp_path):
    """(address, head, worker node, the worker node's scratch folder): a head and a worker node, 1 CPU each, both
    killed by process id (with everything they started) at the end."""
    ray = pytest.importorskip("ray")
    port = _free_port()
    ray_dir = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    env = {**os.environ, "FEDDG_CACHE": str(tmp_path / "cache"), "RAY_TMPDIR": str(ray_dir)}
    scratch = {name: tmp_path / f"scratch_{name}" for name in ("head", "worker")}
    for folder in scratch.values():
        folder.mkdir()
    head = _ray_node(["--head", "--port", str(port), "--include-dashboard=false",
                      "--ray-client-server-port", str(_free_port()), "--temp-dir", str(ray_dir)],
                     {**env, "FEDDG_RAY_SCRATCH": str(scratch["head"])}, tmp_path / "head.log")
    nodes = [head]
    try:
        address = f"127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while not _answers(port):  # ray.init would wait for a head that never came, without end
            assert head.poll() is None and time.monotonic() < deadline, (tmp_path / "head.log").read_text()[-3000:]
            time.sleep(0.5)
        worker = _ray_node(["--address", address], {**env, "FEDDG_RAY_SCRATCH": str(scratch["worker"])},
                           tmp_path / "worker.log")
        nodes.append(worker)
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        while time.monotonic() < deadline and len([n for n in ray.nodes() if n["Alive"]]) < 2:
            time.sleep(0.5)
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2, (tmp_path / "worker.log").read_text()[-2000:]
        yield address, head, worker, scratch["worker"]
    finally:
        ray.shutdown()
        for node in nodes:
            kill_tree(node.pid, 20)
            node.wait(timeout=20)
        shutil.rmtree(ray_dir, ignore_errors=True)


def test_a_ray_sweep_runs_across_two_nodes_and_a_run_lost_with_its_node_is_retried_whole(tmp_path, ray_cluster,
                                                                                            monkeypatch):
    from feddg.benchmark.executors.ray_cluster import RayExecutor

    address, head, worker, worker_scratch = ray_cluster
    monkeypatch.setenv("FEDDG_CACHE", str(tmp_path / "cache"))

    def kill_the_worker_node_mid_run() -> None:
        """Once the worker node's simulator has finished a round, kill the node with everything it started."""
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if any(worker_scratch.glob("feddg-ray-cell-*/ws/server/simulate_job/feddg_progress.json")):
                kill_tree(worker.pid, 20)
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_the_worker_node_mid_run, daemon=True)
    killer.start()
    protocol = Protocol("fundus", TINY_OVERRIDES)
    lines: list[str] = []
    records = sweep(tmp_path / "out", protocol, ["fedavg"], ["Domain1"], [0, 1], timeout=600, report=lines.append,
                    executor=RayExecutor(address, cpus_per_run=1, max_retries=1))
    killer.join(5)
    assert [r["status"] for r in records] == ["ok", "ok"], lines
    assert worker.poll() is not None, f"the worker node was killed mid-run: {lines}"
    attempts = sorted(r["executor"]["attempts"] for r in records)
    assert attempts == [1, 2], "the run on the killed node ran again, once"
    retried = next(r for r in records if r["executor"]["attempts"] == 2)
    assert retried["executor"]["lost"][0]["error"] and retried["executor"]["node_id"]
    assert any("lost (" in line and "starting it again" in line for line in lines)
    for record in records:
        assert record["executor"]["executor"] == "ray" and record["executor"]["address"] == address
        assert case_scores_of(record["report"])["final"]["Domain1"]["test"]
        folder = tmp_path / "out" / "runs" / record["run_id"]
        assert (folder / "feddg_report.json").exists() and "feddg simulate" not in record["log"]
        assert not (folder / "server_files").exists(), "the returned files are kept, the scratch removed"
        assert (folder / "FL_global_model.pt").stat().st_size > 0, "the final model comes back from the worker"
