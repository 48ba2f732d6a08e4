"""A method added by one folder (tests/toy_method) and one registration runs end to end in the real simulator:
the job generator, the rounds, the sites' training and evaluation and the report need no change."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from feddg.flare.registry import Method, register, unregister
from feddg.flare.site_policy import install_resources
from feddg.jobs import JOBS, render_job
from tests.e2e.test_simulator import check_run, make_job, run_job
from tests.toy_method.part import PART

REPO = Path(__file__).resolve().parents[2]
SITES = ["BIDMC", "BMC", "HK", "I2CVB", "RUNMC", "UCL"]


@pytest.fixture
def median():
    method = register(Method("median", (PART,)))
    yield method
    unregister("median")


def test_the_registered_method_is_generated_like_the_projects_own(median):
    server = json.loads(render_job("prostate_median")["app/config/config_fed_server.json"])
    assert {"id": "aggregator", "path": "tests.toy_method.aggregator.MedianAggregator", "args": {}} in \
        server["components"]
    assert "prostate_median" not in JOBS  # the committed jobs are the project's methods only


@pytest.mark.slow
def test_a_method_added_by_one_folder_and_one_registration_runs_in_the_simulator(tmp_path, synthetic_root, median,
                                                                                monkeypatch):
    job = make_job(tmp_path, "prostate_median", synthetic_root["prostate"], rounds=2)
    ws = tmp_path / "ws"
    resources = install_resources(ws / "local")  # the project's allow-list, then the toy method's package on it
    config = json.loads(resources.read_text())
    config["class_allow_list"].append("tests.toy_method.")
    resources.write_text(json.dumps(config, indent=2))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    result = run_job(job, ws, "-t", "6")
    check_run(result, ws, SITES, "RUNMC", ["prostate"], 2)
    log = (ws / "server" / "log.txt").read_text()
    assert "median of the models of 5 sites" in log
