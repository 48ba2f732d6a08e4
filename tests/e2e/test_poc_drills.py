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

from feddg.config import config_from_dict
from feddg.nets.unet import build_model
from feddg.poc import RehearsalError, admin, prepare, start, stop, submit, wait
from feddg.provisioning import hospital_admins
from tests.conftest import tiny_experiment

pytestmark = pytest.mark.slow
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
    weight_names = list(build_model(config_from_dict(exp)).state_dict())
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


def test_fault_drill_a_training_site_dies_mid_job_and_the_rest_finish(tmp_path):
    """A separate POC: BMC's client is killed (by the id of the process the drill started) after the first global
    model is saved; with train.min_sites 1 the job completes on BIDMC, and the last global model loads."""
    import psutil

    from feddg.inference import load_checkpoint
    from feddg.jobs import write_job
    from feddg.poc import download

    exp = _experiment()
    exp["train"].update(rounds=4, local_epochs=2, min_sites=1, task_timeout=60)
    job = write_job(tmp_path / "jobs", "prostate_fedavg", exp)
    p = prepare(tmp_path / "poc", "prostate", SITES)
    try:
        start(p)
        job_id = submit(p, job)
        checkpoint = p.kit(p.server) / job_id / "app_server" / "FL_global_model.pt"
        import time

        deadline = time.monotonic() + 300
        while not checkpoint.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert checkpoint.exists(), "no global model saved within 300 s"
        victim = p.processes[1 + SITES.index("BMC")]
        for proc in [*psutil.Process(victim.pid).children(recursive=True), psutil.Process(victim.pid)]:
            proc.kill()
        assert wait(p, job_id, 900) == "FINISHED:COMPLETED"
        report = json.loads(download(p, job_id, tmp_path / "result").read_text())
        history = report["history"]
        assert len(history) == 4 and history[-1]["sites"] == ["BIDMC"]  # BMC gone, the round went on
        assert "BMC" in report["models"]["final"]["missing_sites"]
        model, cfg = load_checkpoint(next((tmp_path / "result").rglob("FL_global_model.pt")))
        assert cfg.train.rounds == 4 and sum(v.numel() for v in model.state_dict().values()) > 0
    finally:
        stop(p)
