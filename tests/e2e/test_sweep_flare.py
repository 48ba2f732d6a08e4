"""``feddg benchmark --executor flare``: a lead's sweep submitted to a real NVFlare deployment (the POC harness with
the consortium's kits, the project's site policy and the server's job scheduler at ``max_jobs`` 2).

One POC serves the whole test, in this order:

1. Ctrl-C while the sweep's jobs run: the sweep exits 130, every job it submitted is aborted in the deployment,
   and no run has a finished record (an interrupted run's record says so and holds no report).
2. The same command again: the 2 methods x 2 held-out sites all finish, two jobs at a time (the scheduler's
   max_jobs; the sweep may have four in the deployment), each ``run.json`` of the same form as a simulator run's,
   naming the server, the job and the sites; the held-out hospital only evaluated. The data stay at the sites:
   each site reads its own ``data_root`` (local/feddg_site.json), and the jobs name no data path.
3. One of those cells run by the local simulator gives the same per-case scores, bit for bit.
4. The deployment's server restarts while a job of the sweep runs: the run is recorded as interrupted (no result),
   which the next sweep runs again, as after Ctrl-C.

Every process the test started is stopped by its id; every wait is bounded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from feddg.benchmark.reproduce import case_scores_of
from feddg.flare.site_config import SITE_CONFIG_FILE
from feddg.poc import _wait_for_port, prepare, start, start_participant, stop, stop_processes
from feddg.provisioning import FED_LEARN_PORT
from tests.conftest import on_poc_ports
from tests.processes import processes_naming

pytestmark = [pytest.mark.slow, on_poc_ports]
SITES = ["BIDMC", "BMC", "RUNMC"]
METHODS, HELD_OUT = ["fedavg", "uniform"], ["RUNMC", "BMC"]
SCHEDULER_MAX_JOBS = 2
SWEEP_TIMEOUT_S = 900  # the whole second sweep; one tiny job takes well under a minute
INTERRUPT_TIMEOUT_S = 300


def _protocol_args(root: Path, methods: list[str] = METHODS, held_out: list[str] = HELD_OUT) -> list[str]:
    sets = {"data.sites": f"[{','.join(SITES)}]", "data.image_size": "32", "model.features": "[8,8,16,32,64,8]",
            "train.rounds": "1", "train.local_epochs": "1", "train.batch_size": "4", "eval.batch_size": "8"}
    return ["--task", "prostate", "--methods", ",".join(methods), "--held-out", ",".join(held_out), "--seeds", "0",
            "--data-root", str(root), "--layout", "saml_nifti", "--resamples", "99", "--run-timeout", "600",
            *(a for key, value in sets.items() for a in ("--set", f"{key}={value}"))]


def _sweep(out: Path, root: Path, executor: list[str], **cells: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "feddg.cli", "benchmark", "--out", str(out),
                             *_protocol_args(root, **cells), *executor], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _finish(proc: subprocess.Popen, timeout: float) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the sweep's own process group: it started no site process
        out, _ = proc.communicate()
        pytest.fail(f"the sweep exceeded {timeout} s:\n{out[-5000:]}")
    return out


def _log_times(log: Path, marker: str) -> list[datetime]:
    return [datetime.fromisoformat(line.split(" flare: ")[0]) for line in log.read_text().splitlines()
            if " flare: " in line and marker in line]


def _job_ids(out: Path) -> list[str]:
    return [line.rsplit(" as job ", 1)[1].split()[0] for log in sorted(out.glob("runs/*/simulate.log"))
            for line in log.read_text().splitlines() if " as job " in line]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, synthetic_root):
    """A POC of the prostate consortium restricted to SITES: the scheduler at max_jobs 2, each hospital's own data
    root in its local/feddg_site.json."""
    poc = prepare(tmp_path_factory.mktemp("flare_deployment") / "poc", "prostate", SITES)
    resources_path = poc.kit(poc.server) / "local" / "resources.json"
    resources = json.loads(resources_path.read_text())
    scheduler = next(c for c in resources["components"] if c["id"] == "job_scheduler")
    scheduler["args"]["max_jobs"] = SCHEDULER_MAX_JOBS
    resources_path.write_text(json.dumps(resources, indent=2))
    for site in SITES:
        own = {"data_root": str(synthetic_root["prostate"])}  # one host here: every site's copy is the same folder
        (poc.kit(site) / "local" / SITE_CONFIG_FILE).write_text(json.dumps(own))
    try:
        start(poc)
        yield poc
    finally:
        stop(poc)
        assert processes_naming(poc.workspace) == [], "processes of the POC are still running"


def test_a_lead_sweeps_in_the_deployment_interrupts_resumes_and_matches_the_simulator(deployment, tmp_path,
                                                                                          synthetic_root):
    from nvflare.fuel.flare_api.flare_api import new_secure_session

    root, out = synthetic_root["prostate"], tmp_path / "bench"
    executor = ["--executor", "flare", "--kit", str(deployment.kit(deployment.lead)), "--max-jobs", "4"]

    # 1. Ctrl-C while jobs run: exit 130, the sweep's jobs aborted, no finished record
    first = _sweep(out, root, executor)
    deadline = time.monotonic() + INTERRUPT_TIMEOUT_S
    while not any(_log_times(log, "RUNNING") for log in out.glob("runs/*/simulate.log")):
        assert first.poll() is None and time.monotonic() < deadline, "no job ran within the bound"
        time.sleep(0.5)
    first.send_signal(signal.SIGINT)
    text = _finish(first, INTERRUPT_TIMEOUT_S)
    assert first.returncode == 130, text[-3000:]
    submitted = _job_ids(out)
    assert submitted, text[-3000:]
    session = new_secure_session(deployment.lead, str(deployment.kit(deployment.lead)), timeout=30)
    try:
        statuses = {job: session.get_job_meta(job)["status"] for job in submitted}
    finally:
        session.close()
    assert all(s.startswith("FINISHED") for s in statuses.values()), statuses
    records = [json.loads(p.read_text()) for p in out.glob("runs/*/run.json")]
    assert records and all(r["status"] in ("interrupted", "ok") for r in records), records
    assert any(r["status"] == "interrupted" and "report" not in r for r in records)

    # 2. The same command runs what is left, two jobs at a time in the deployment
    started = time.monotonic()
    second = _sweep(out, root, executor)
    text = _finish(second, SWEEP_TIMEOUT_S)
    sweep_s = time.monotonic() - started
    assert second.returncode == 0, text[-5000:]
    runs = {p.parent.name: json.loads(p.read_text()) for p in sorted(out.glob("runs/*/run.json"))}
    assert sorted(runs) == sorted(f"prostate_{m}_{h}_seed0" for m in METHODS for h in HELD_OUT)
    intervals = []
    for run_id, record in runs.items():
        assert record["status"] == "ok", (run_id, record.get("reason"))
        where = record["executor"]
        assert where["executor"] == "flare" and where["submitted_by"] == deployment.lead
        assert where["sites"] == SITES and where["job_id"] and where["server"] == "localhost:8003"
        held_out = record["run"]["held_out"]
        assert record["config"]["data"]["root"] == str(root)  # the protocol's record; the job carried none
        history_sites = {site for entry in record["report"]["history"] for site in entry["sites"]}
        assert history_sites == set(SITES) - {held_out}  # the held-out hospital never trained
        scores = case_scores_of(record["report"])["final"][held_out]["test"]
        assert scores, f"{run_id}: no per-case scores of the held-out site"
        assert (out / "runs" / run_id / "feddg_report.json").exists()
        assert (out / "runs" / run_id / "FL_global_model.pt").stat().st_size > 0  # the final model is kept
        assert not (out / "runs" / run_id / "flare").exists()  # the rest of the download is not
        log = out / "runs" / run_id / "simulate.log"
        intervals.append((_log_times(log, "RUNNING")[-1], _log_times(log, ": ok")[-1]))
    at_once = max(sum(1 for s, e in intervals if s <= moment < e) for moment, _ in intervals)
    assert at_once == SCHEDULER_MAX_JOBS, intervals
    print(f"\nthe deployment ran the 2x2 sweep in {sweep_s:.0f} s, {at_once} jobs at once")

    # 3. The local simulator gives the same per-case scores for one cell (bit for bit: the same floats)
    local_out = tmp_path / "bench_local"
    started = time.monotonic()
    local = _sweep(local_out, root, ["--executor", "local"], methods=["fedavg"], held_out=["RUNMC"])
    text = _finish(local, SWEEP_TIMEOUT_S)
    print(f"the same cell in the local simulator: {time.monotonic() - started:.0f} s")
    assert local.returncode == 0, text[-5000:]
    simulated = json.loads((local_out / "runs" / "prostate_fedavg_RUNMC_seed0" / "run.json").read_text())
    assert simulated["executor"]["executor"] == "local"
    assert simulated["config"] == runs["prostate_fedavg_RUNMC_seed0"]["config"]
    assert case_scores_of(simulated["report"]) == case_scores_of(runs["prostate_fedavg_RUNMC_seed0"]["report"])


def _connected(poc, timeout: float) -> None:
    """Wait (at most ``timeout`` s) until every site is a connected client again."""
    from nvflare.fuel.flare_api.flare_api import new_secure_session

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            session = new_secure_session(poc.lead, str(poc.kit(poc.lead)), timeout=10)
            try:
                if {c.name for c in session.get_system_info().client_info} >= set(SITES):
                    return
            finally:
                session.close()
        except Exception:  # noqa: BLE001 - the server is still starting
            pass
        time.sleep(2)
    pytest.fail(f"the sites did not reconnect within {timeout} s")


def test_a_run_killed_by_a_server_restart_is_recorded_as_interrupted(deployment, tmp_path, synthetic_root):
    root, out = synthetic_root["prostate"], tmp_path / "bench_restart"
    cell = {"methods": ["fedavg"], "held_out": ["BMC"]}
    executor = ["--executor", "flare", "--kit", str(deployment.kit(deployment.lead)), "--reconnect-timeout", "120"]
    first = _sweep(out, root, executor, **cell)
    deadline = time.monotonic() + INTERRUPT_TIMEOUT_S
    while not any(_log_times(log, "RUNNING") for log in out.glob("runs/*/simulate.log")):
        assert first.poll() is None and time.monotonic() < deadline, "no job ran within the bound"
        time.sleep(0.5)
    time.sleep(3)
    stop_processes([deployment.processes[0]])  # the server, by its process id, with the processes it started
    deployment.processes[0] = start_participant(deployment.kit(deployment.server),
                                                deployment.workspace / "logs" / "server_restarted.log")
    _wait_for_port("localhost", FED_LEARN_PORT, 120, deployment)
    text = _finish(first, INTERRUPT_TIMEOUT_S)
    record = json.loads((out / "runs" / "prostate_fedavg_BMC_seed0" / "run.json").read_text())
    assert record["status"] == "interrupted" and "report" not in record, text[-3000:]
    assert "server restarted" in record["reason"]
    assert first.returncode == 1, text[-3000:]  # the sweep reports the run that did not finish

    # an interrupted run is run again by the next sweep (checked after Ctrl-C above); here only the deployment is
    # made whole again for whatever runs next
    _connected(deployment, 120)
