"""The recipes run end to end: ``python job.py JOB --env sim`` in NVFlare's SimEnv with the project's site policy,
and ``--env poc`` in a local POC of the consortium's kits where a lead submits; tiny settings, every wait bounded,
each command in its own process group so that a hung run is stopped by the id of the process this test started.

Run the POC test alone (it starts a server on the POC's fixed ports and a process per site)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from nvflare.recipe.sim_env import SIMULATOR_WORKSPACE_ROOT_ENV_VAR, SimEnv

from feddg.flare.site_policy import class_allow_list
from feddg.poc import FED_LEARN_PORT
from tests.conftest import REPOSITORY, as_sets, on_poc_ports, tiny_sets
from tests.processes import processes_naming, run_bounded

pytestmark = [pytest.mark.slow, on_poc_ports]
SITES = ["BIDMC", "BMC", "RUNMC"]  # BIDMC's lead submits in the POC; RUNMC is held out
TIMEOUT_S = 600


def tiny(root: Path | None = None, rounds: int = 2) -> list[str]:
    """``--set`` assignments of a tiny three-site prostate run (32 px, a narrow net, one epoch a round)."""
    sites = {"sites": SITES, "unseen_site": "RUNMC", **({"root": str(root)} if root is not None else {})}
    return [*tiny_sets("prostate", rounds=rounds, local_epochs=1), *as_sets({"data": sites})]


def job_py(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return run_bounded([sys.executable, str(REPOSITORY / "job.py"), *args], TIMEOUT_S, env)


def test_a_tiny_ga_recipe_runs_in_simenv_with_the_projects_policy(tmp_path):
    """The run lands where NVFLARE_SIMULATOR_WORKSPACE_ROOT says (over -w), over NVFlare's generic allow-list
    left there by a plain SimEnv run, and GA acts on the gaps its site hook sends."""
    root = tmp_path / "from_env"
    SimEnv._ensure_default_component_policy(str(root / "prostate_ga"))  # NVFlare's generic list, in .default
    env = {**os.environ, SIMULATOR_WORKSPACE_ROOT_ENV_VAR: str(root)}
    result = job_py("prostate_ga", "--env", "sim", "-w", str(tmp_path / "given"), *tiny(), env=env)
    assert result.returncode == 0, result.stdout[-5000:]
    report_path = root / "prostate_ga" / "server" / "simulate_job" / "feddg_report.json"
    assert f"prostate_ga on --env sim, unseen site RUNMC (report: {report_path})" in result.stdout
    report = json.loads(report_path.read_text())
    assert [h["round"] for h in report["history"]] == [0, 1]
    weights = report["history"][1]["aggregation"]["ga_weights"]
    assert sorted(weights) == ["BIDMC", "BMC"] and weights["BIDMC"] != weights["BMC"]  # the gaps arrived
    resources = json.loads((root / "prostate_ga" / "local" / "resources.json").read_text())
    assert resources["class_allow_list"] == class_allow_list()
    assert "3 site process(es) on this host" in (root / "prostate_ga" / "BMC" / "log.txt").read_text()
    assert not (tmp_path / "given").exists()
    assert processes_naming(root) == []


def test_a_tiny_recipe_runs_in_a_poc_where_a_lead_submits(tmp_path, synthetic_root):
    import socket

    with socket.socket() as s:
        if s.connect_ex(("localhost", FED_LEARN_PORT)) == 0:
            pytest.skip(f"port {FED_LEARN_PORT} is in use: another POC runs on this machine (run this test alone)")
    ws = tmp_path / "poc"
    result = job_py("prostate_fedavg", "--env", "poc", "--workspace", str(ws), "--timeout", "400",
                    *tiny(synthetic_root["prostate"], rounds=1))
    assert result.returncode == 0, result.stdout[-5000:]
    assert "lead@bidmc.hospital.example.org submits prostate_fedavg" in result.stdout
    reports = sorted((ws / "results").rglob("feddg_report.json"))
    assert len(reports) == 1 and f"(report: {reports[0]})" in result.stdout
    report = json.loads(reports[0].read_text())
    assert report["unseen_site"] == "RUNMC" and sorted(report["history"][0]["sites"]) == ["BIDMC", "BMC"]
    privacy = json.loads((ws / "nvflare_poc" / "feddg_prostate" / "prod_00" / "BMC" / "local" / "privacy.json"
                          ).read_text())
    assert privacy["default_scope"] == "feddg"  # the site policy was in force
    assert processes_naming(ws) == [], "processes of the POC are still running"


def test_a_tiny_recipe_is_submitted_to_a_deployment_as_the_lead_of_the_kit(tmp_path, synthetic_root):
    """``--env prod`` against a running deployment of the consortium's kits (a POC of them, started and stopped
    here by process id): the checks pass, ProdEnv submits as the kit's own lead, the result is downloaded."""
    import socket

    from feddg import poc

    with socket.socket() as s:
        if s.connect_ex(("localhost", FED_LEARN_PORT)) == 0:
            pytest.skip(f"port {FED_LEARN_PORT} is in use: another POC runs on this machine (run this test alone)")
    deployment = poc.prepare(tmp_path / "deployment", "prostate", SITES)
    kit = deployment.kit(deployment.lead)
    try:
        poc.start(deployment)
        result = job_py("prostate_fedavg", "--env", "prod", "--kit", str(kit), "--timeout", "400",
                        *tiny(synthetic_root["prostate"], rounds=1))
    finally:
        poc.stop(deployment)
    assert result.returncode == 0, result.stdout[-5000:]
    reports = sorted(kit.rglob("feddg_report.json"))
    assert len(reports) == 1 and f"(report: {reports[0]})" in result.stdout
    assert json.loads(reports[0].read_text())["unseen_site"] == "RUNMC"
    assert processes_naming(tmp_path / "deployment") == []
