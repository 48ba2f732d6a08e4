"""Drills in a real POC (the simulator does not enforce site policy): privacy and authorization.

One POC (server + BIDMC, BMC, RUNMC with the consortium's kits and the project's site policy) serves every drill.
The privacy drill's attacker is a test-only executor (``drill/feddg_drill.py``) that the drill copies into the
sites' ``local/custom`` and adds to their allow-list, as the production issue allows; the job itself configures
no filter.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from feddg.experiment import experiment_from_dict
from feddg.nets.unet import build_model
from feddg.poc import RehearsalError, admin, prepare, start, stop, submit, wait
from feddg.provisioning import hospital_admins
from tests.conftest import on_poc_ports, tiny_experiment

pytestmark = [pytest.mark.slow, on_poc_ports]
SITES = ["BIDMC", "BMC", "RUNMC"]
DRILL = Path(__file__).parent / "drill" / "feddg_drill.py"


@pytest.fixture(scope="module")
def poc(tmp_path_factory):
    ws = tmp_path_factory.mktemp("drills")
    p = prepare(ws / "poc", "prostate", SITES)
    for kit in [p.kit(p.server), *(p.kit(s) for s in SITES)]:
        custom = kit / "local" / "custom"
        custom.mkdir(parents=True, exist_ok=True)
        shutil.copy(DRILL, custom / DRILL.name)
        resources_path = kit / "local" / "resources.json"
        resources = json.loads(resources_path.read_text())
        resources["class_allow_list"].append("feddg_drill.")
        resources_path.write_text(json.dumps(resources, indent=2))
    try:
        start(p)
        yield p
    finally:
        stop(p)


def _experiment() -> dict:
    exp = tiny_experiment("prostate")
    exp["data"]["sites"] = SITES
    return exp


def _attack_job(root: Path, scope: str | None = None, custom_code: bool = False) -> Path:
    exp = _experiment()
    weight_names = list(build_model(experiment_from_dict(exp)).state_dict())
    job = root / ("byoc_job" if custom_code else f"attack_job_{scope or 'default'}")
    config = job / "app" / "config"
    config.mkdir(parents=True)
    meta = {"name": job.name, "resource_spec": {}, "deploy_map": {"app": ["server", *SITES]}, "min_clients": 3}
    if scope:
        meta["scope"] = scope
    (job / "meta.json").write_text(json.dumps(meta))
    (config / "feddg.yaml").write_text(yaml.safe_dump(exp))
    (config / "config_fed_server.json").write_text(json.dumps({"format_version": 2, "workflows": [
        {"id": "recorder", "path": "feddg_drill.AttackRecorder",
         "args": {"sites": ["BIDMC", "BMC"], "weight_names": weight_names}}], "components": []}))
    (config / "config_fed_client.json").write_text(json.dumps({"format_version": 2, "executors": [
        {"tasks": ["amplitude_spectra", "train"], "executor": {"id": "attacker", "path": "feddg_drill.Attacker",
                                                                 "args": {}}}],
        "task_result_filters": [], "task_data_filters": [], "components": []}))
    if custom_code:
        (job / "app" / "custom").mkdir()
        (job / "app" / "custom" / "anything.py").write_text("X = 1\n")
    return job


def test_privacy_drill_the_site_policy_blocks_everything_but_the_allowed_payload(poc, tmp_path):
    job_id = submit(poc, _attack_job(tmp_path))
    assert wait(poc, job_id, 600) == "FINISHED:COMPLETED"
    out = tmp_path / "result"
    admin(poc, ["download", job_id, "-o", str(out), "--force"], 300, "job download")
    records = json.loads(next(out.rglob("drill_results.json")).read_text())
    assert len(records) == 5 * 2  # five payloads from two sites
    for r in records:
        if r["mode"] == "window":
            assert r["rc"] == "OK" and r["kind"] == "AMPLITUDE_WINDOW", r
        else:  # blocked at the site: the server got an error code and no data
            assert r["rc"] == "TASK_RESULT_FILTER_ERROR" and r["kind"] is None and r["keys"] == [], r
    log = (poc.workspace / "logs" / "BIDMC.log").read_text() + "".join(
        p.read_text(errors="replace") for p in poc.kit("BIDMC").rglob("log*.txt"))
    assert "site policy: task amplitude_spectra: blocked the result leaving the site" in log


def test_a_job_naming_an_unknown_privacy_scope_is_refused(poc, tmp_path):
    job_id = submit(poc, _attack_job(tmp_path, scope="no_such_scope"))
    assert wait(poc, job_id, 300) == "FINISHED:FAILED_TO_RUN"


def test_a_member_cannot_submit(poc, tmp_path):
    with pytest.raises(RehearsalError, match="job submit failed"):
        submit(poc, _attack_job(tmp_path), user=hospital_admins("BIDMC")["member"])


def test_a_job_with_custom_code_is_refused(poc, tmp_path):
    try:
        job_id = submit(poc, _attack_job(tmp_path, custom_code=True))
    except RehearsalError:
        return  # refused at submission
    assert wait(poc, job_id, 300) != "FINISHED:COMPLETED"

