"""The POC rehearsal end to end: the consortium's kits and site policy, a lead submits a tiny job with
`nvflare job submit`, the result is downloaded and printed, and every process the rehearsal started is gone."""

from __future__ import annotations

import json
import math
import sys

import pytest

from feddg.recipes.export import write_job
from tests.conftest import on_poc_ports, tiny_experiment
from tests.processes import processes_naming, run_bounded

pytestmark = [pytest.mark.slow, on_poc_ports]
TIMEOUT_S = 900




def test_poc_rehearsal_runs_a_job_across_the_hospitals(tmp_path, synthetic_root):
    job = write_job(tmp_path / "jobs", "prostate_fedavg",
                    tiny_experiment("prostate", root=str(synthetic_root["prostate"]), rounds=1))
    ws = tmp_path / "poc"
    result = run_bounded([sys.executable, "-m", "feddg.cli", "poc", str(job), "--workspace", str(ws), "--timeout",
                          "600"], TIMEOUT_S)
    out = result.stdout
    assert result.returncode == 0, out[-5000:]
    assert "lead@bidmc.hospital.example.org submits prostate_fedavg" in out
    assert "prostate_fedavg in the POC, unseen site RUNMC" in out
    report = json.loads(next((ws / "results").rglob("feddg_report.json")).read_text())
    runmc = report["models"]["final"]["sites"]["RUNMC"]["splits"]["test"]["prostate"]["dice"]["mean"]
    assert math.isfinite(runmc)
    assert sorted(report["history"][0]["sites"]) == ["BIDMC", "BMC", "HK", "I2CVB", "UCL"]
    # The site policy was in force: the egress filter is the default scope of every hospital.
    privacy = json.loads((ws / "nvflare_poc" / "feddg_prostate" / "prod_00" / "BIDMC" / "local" / "privacy.json").read_text())
    assert privacy["default_scope"] == "feddg"
    assert processes_naming(ws) == [], "processes of the rehearsal are still running"
