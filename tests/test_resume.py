"""`feddg resume-job` refuses what it cannot resume, and writes a self-contained job otherwise."""

import json

import pytest

from feddg.jobs import write_job
from feddg.resume import resume_job
from tests.conftest import tiny_experiment


def _previous(tmp_path, done, ga=True):
    run = tmp_path / "prev" / "server" / "simulate_job"
    (run / "app_server").mkdir(parents=True)
    (run / "feddg_progress.json").write_text(json.dumps({"rounds_completed": done, "total_rounds": 4}))
    (run / "app_server" / "FL_global_model.pt").write_bytes(b"model")
    if ga:
        (run / "ga_weights.json").write_text(json.dumps({"weights": {}, "history": []}))
    return tmp_path / "prev"


def test_a_resumed_job_carries_its_state_and_starts_at_the_next_round(tmp_path):
    job = write_job(tmp_path / "jobs", "prostate_ga", tiny_experiment("prostate", rounds=4))
    out, start, total = resume_job(job, _previous(tmp_path, 2), tmp_path / "resumed")
    assert (start, total) == (2, 4)
    server = json.loads((out / "app" / "config" / "config_fed_server.json").read_text())
    workflow = next(w for w in server["workflows"] if w["path"].endswith("LeaveOneSiteOutFedAvg"))
    components = {c["id"]: c for c in server["components"]}
    assert workflow["args"]["start_round"] == 2
    assert components["persistor"]["args"]["source_ckpt_file_full_name"] == "resume/FL_global_model.pt"
    assert components["aggregator"]["args"]["resume_from"] == "resume/ga_weights.json"
    assert (out / "app" / "config" / "resume" / "FL_global_model.pt").read_bytes() == b"model"
    assert not (out / "app" / "custom").exists()  # no code: the hospitals still accept it
    assert json.loads((out / "meta.json").read_text())["name"] == "prostate_ga_resumed"


def test_refusals(tmp_path):
    job = write_job(tmp_path / "jobs", "prostate_ga", tiny_experiment("prostate", rounds=4))
    with pytest.raises(ValueError, match="no feddg_progress.json"):
        resume_job(job, tmp_path / "empty", tmp_path / "a")
    with pytest.raises(ValueError, match="already trained 4 of 4 rounds"):
        resume_job(job, _previous(tmp_path, 4), tmp_path / "b")
    prev = _previous(tmp_path / "x", 1, ga=False)
    with pytest.raises(ValueError, match="no ga_weights.json"):
        resume_job(job, prev, tmp_path / "c")
