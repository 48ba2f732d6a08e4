"""A method added from outside the package (tests/toy_method) and registered as a plug-in (an entry point in the
group ``feddg.methods``) runs end to end in the real simulator: its own feddg.yaml section is validated at the
server and every site, its site hook's value reaches its aggregator through the sites' egress filter, and its server
file is written; the job generator, the rounds, the sites' training and evaluation and the report need no change."""

from __future__ import annotations

import json
import os
import sys

import pytest

from feddg.flare.registry import register_entry_points, unregister
from feddg.flare.site_policy import install_resources
from feddg.jobs import JOBS
from feddg.recipes.export import job_files
from tests.e2e.test_simulator import check_run, make_job, run_job
from tests.toy_method.plugin import write_plugin
from tests.conftest import REPOSITORY

SITES = ["BIDMC", "BMC", "HK", "I2CVB", "RUNMC", "UCL"]


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """The toy method installed as a plug-in: registered here, and in every process the simulator starts."""
    folder = write_plugin(tmp_path / "plugin")
    monkeypatch.syspath_prepend(str(folder))
    assert register_entry_points() == ["median"]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(folder), str(REPOSITORY), os.environ.get("PYTHONPATH", "")]))
    yield folder
    unregister("median")
    sys.modules.pop("tests.toy_method.part", None)


def test_the_plugin_method_is_generated_like_the_projects_own(plugin):
    files = job_files("prostate_median", {"median": {"trim": 1}})
    server = json.loads(files["app/config/config_fed_server.json"])
    assert {"id": "aggregator", "path": "tests.toy_method.aggregator.MedianAggregator",
            "args": {"config_file": "feddg.yaml"}} in server["components"]
    client = json.loads(files["app/config/config_fed_client.json"])
    assert client["executors"][0]["executor"]["args"]["site_hooks"] == ["update_norm"]
    assert {"id": "update_norm", "path": "tests.toy_method.hook.UpdateNorm", "args": {}} in client["components"]
    assert "median:\n  trim: 1\n" in files["app/config/feddg.yaml"]
    assert "prostate_median" not in JOBS  # the committed jobs are the project's methods only


@pytest.mark.slow
def test_a_plugin_method_with_a_section_a_hook_and_a_server_file_runs_in_the_simulator(tmp_path, synthetic_root,
                                                                                       plugin):
    job = make_job(tmp_path, "prostate_median", synthetic_root["prostate"], rounds=2)
    config = job / "app" / "config" / "feddg.yaml"
    config.write_text(config.read_text().replace("median:\n  trim: 0\n", "median:\n  trim: 1\n"))
    ws = tmp_path / "ws"
    resources = install_resources(ws / "local")  # the project's allow-list, then the toy method's package on it
    allow = json.loads(resources.read_text())
    allow["class_allow_list"].append("tests.toy_method.")
    resources.write_text(json.dumps(allow, indent=2))
    result = run_job(job, ws, "-t", "6")
    check_run(result, ws, SITES, "RUNMC", ["prostate"], 2)
    log = (ws / "server" / "log.txt").read_text()
    assert "median of the models of 4 sites" in log  # 5 training sites, trim 1
    history = json.loads((ws / "server" / "simulate_job" / "median_history.json").read_text())["history"]
    assert [h["round"] for h in history] == [0, 1]
    for entry in history:  # every site's hook value arrived, and the largest was left out
        assert sorted(entry["norms"]) == sorted(s for s in SITES if s != "RUNMC")
        assert all(v > 0 for v in entry["norms"].values())
        assert entry["dropped"] == [max(entry["norms"], key=entry["norms"].get)]
