"""`feddg resume-job` refuses what it cannot resume, and writes a self-contained job otherwise."""

import json
import shutil

import pytest

from feddg.flare.constants import FedDGMeta
from feddg.flare.controller import ROUNDS_COMPLETED

RUN_ID = FedDGMeta.RUN_ID
from feddg.recipes.export import write_job
from feddg.resume import resume_job
from tests.conftest import tiny_experiment
from tests.test_inference import save_checkpoint

RUN = "a" * 32


def _previous(tmp_path, done, ga=True, exp=None, progress=None, meta=None, ga_rounds=None):
    """A previous run's result as the workflow leaves it: the progress file and the checkpoint of one save (run
    ``RUN``, ``done`` rounds) and, with ``ga``, GA's history up to round ``done - 1``. The keyword arguments
    replace one part with a bad one."""
    run = tmp_path / "prev" / "server" / "simulate_job"
    (run / "app_server").mkdir(parents=True)
    (run / "feddg_progress.json").write_text(json.dumps(
        progress if progress is not None else {"rounds_completed": done, "total_rounds": 4, "run_id": RUN}))
    save_checkpoint(run / "app_server" / "FL_global_model.pt", exp or tiny_experiment("prostate", rounds=4),
                    meta=meta if meta is not None else {RUN_ID: RUN, ROUNDS_COMPLETED: done, "nr_aggregated": 5})
    if ga:
        rounds = range(done) if ga_rounds is None else ga_rounds
        (run / "ga_weights.json").write_text(json.dumps({"weights": {}, "history": [{"round": r} for r in rounds]}))
    return tmp_path / "prev"


@pytest.fixture
def job(tmp_path):
    return write_job(tmp_path / "jobs", "prostate_ga", tiny_experiment("prostate", rounds=4))


def test_a_resumed_job_carries_its_state_and_starts_at_the_next_round(tmp_path, job):
    previous = _previous(tmp_path, 2)
    out, start, total = resume_job(job, previous, tmp_path / "resumed")
    assert (start, total) == (2, 4)
    server = json.loads((out / "app" / "config" / "config_fed_server.json").read_text())
    workflow = next(w for w in server["workflows"] if w["path"].endswith("LeaveOneSiteOutFedAvg"))
    components = {c["id"]: c for c in server["components"]}
    assert workflow["args"]["start_round"] == 2
    assert components["persistor"]["args"]["source_ckpt_file_full_name"] == "resume/FL_global_model.pt"
    assert components["aggregator"]["args"]["resume_from"] == "resume/ga_weights.json"
    carried = out / "app" / "config" / "resume" / "FL_global_model.pt"
    assert carried.read_bytes() == next(previous.rglob("FL_global_model.pt")).read_bytes()
    assert not (out / "app" / "custom").exists()  # no code: the hospitals still accept it
    assert json.loads((out / "meta.json").read_text())["name"] == "prostate_ga_resumed"
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".")] == []  # no scratch folder left


def test_refusals(tmp_path, job):
    with pytest.raises(ValueError, match="no feddg_progress.json"):
        resume_job(job, tmp_path / "empty", tmp_path / "a")
    with pytest.raises(ValueError, match="already trained 4 of 4 rounds"):
        resume_job(job, _previous(tmp_path, 4), tmp_path / "b")
    prev = _previous(tmp_path / "x", 1, ga=False)
    with pytest.raises(ValueError, match="continues ga_weights.json, which is not here"):
        resume_job(job, prev, tmp_path / "c")


def _fundus():
    return tiny_experiment("fundus", rounds=4)


def _other_unseen_site():
    exp = tiny_experiment("prostate", rounds=4)
    exp["data"]["unseen_site"] = "BMC"
    return exp


def _wider():
    exp = tiny_experiment("prostate", rounds=4)
    exp["model"]["features"] = [16, 16, 32, 64, 128, 16]
    exp["data"]["image_size"] = 64
    return exp


@pytest.mark.parametrize("bad, message", [
    ({"progress": {"total_rounds": 4, "run_id": RUN}},
     r"feddg_progress\.json: rounds_completed is missing; not a progress file the workflow wrote"),
    ({"progress": {"rounds_completed": "2", "run_id": RUN}},
     r"feddg_progress\.json: rounds_completed must be a whole number of at least 1, got '2'"),
    ({"progress": ["rounds_completed", 2]}, r"feddg_progress\.json: expected a JSON object, got an array"),
    ({"progress": {"rounds_completed": 2, "total_rounds": 4}},
     r"feddg_progress\.json: no run_id, so nothing shows that FL_global_model\.pt is the model saved after those 2 "
     r"rounds"),
    ({"meta": {"nr_aggregated": 5}}, r"FL_global_model\.pt: the model does not record the run and round it was saved "
                                     r"after"),
    ({"meta": {RUN_ID: "b" * 32, ROUNDS_COMPLETED: 2}},
     r"FL_global_model\.pt and .*feddg_progress\.json come from two different runs \(model saved by run b{32}, "
     r"progress of run a{32}\)"),
    ({"meta": {RUN_ID: RUN, ROUNDS_COMPLETED: 3}},
     r"FL_global_model\.pt was saved after 3 round\(s\), but .*feddg_progress\.json records 2"),
    ({"exp": _fundus()},
     r"FL_global_model\.pt: the previous run trained another experiment than .*feddg\.yaml: data\.task: job "
     r"'prostate', checkpoint 'fundus'; data\.sites: job \[.*\], checkpoint \[.*\]; data\.unseen_site: job 'RUNMC', "
     r"checkpoint '.+'$"),
    ({"exp": _other_unseen_site()}, r"another experiment than .*: data\.unseen_site: job 'RUNMC', checkpoint 'BMC'$"),
    ({"exp": _wider()}, r"another experiment than .*: data\.image_size: job 32, checkpoint 64; model\.features: job "
                        r"\[8, 8, 16, 32, 64, 8\], checkpoint \[16, 16, 32, 64, 128, 16\]$"),
    ({"ga_rounds": [0, 1, 2]}, r"ga_weights\.json: the history ends with round 2, but the model was saved after "
                               r"round 1"),
    ({"ga_rounds": []}, r"ga_weights\.json: the history is empty, but the model was saved after round 1"),
], ids=["no-rounds", "rounds-not-a-number", "progress-not-an-object", "old-progress-without-run", "old-checkpoint",
        "two-runs", "two-rounds", "other-task", "other-unseen-site", "other-network", "ga-ahead", "ga-empty"])
def test_a_result_that_does_not_hold_together_is_refused_and_nothing_is_written(tmp_path, job, bad, message):
    previous = _previous(tmp_path, 2, **bad)
    with pytest.raises(ValueError, match=message) as refused:
        resume_job(job, previous, tmp_path / "out" / "resumed")
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("content", [b"", b"model"], ids=["zero-bytes", "not-a-checkpoint"])
def test_an_unusable_checkpoint_is_refused_through_the_cli(tmp_path, job, capsys, content):
    from feddg.cli import main

    previous = _previous(tmp_path, 2)
    checkpoint = next(previous.rglob("FL_global_model.pt"))
    checkpoint.write_bytes(content)
    assert main(["resume-job", str(job), "--from", str(previous), "--out", str(tmp_path / "resumed")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"feddg resume-job: error: {checkpoint}: ") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "resumed").exists()


def test_a_checkpoint_with_nan_weights_is_refused(tmp_path, job):
    import torch

    previous = _previous(tmp_path, 2)
    checkpoint = next(previous.rglob("FL_global_model.pt"))
    saved = torch.load(checkpoint, weights_only=True)
    name = next(iter(saved["model"]))
    saved["model"][name] = torch.full_like(saved["model"][name], float("nan"))
    torch.save(saved, checkpoint)
    with pytest.raises(ValueError, match=f"{checkpoint}: the weights do not fit: parameter {name!r} holds NaN"):
        resume_job(job, previous, tmp_path / "resumed")


def test_a_failure_while_writing_leaves_nothing_behind_so_the_rerun_works(tmp_path, job, monkeypatch):
    previous = _previous(tmp_path, 2)
    out = tmp_path / "new" / "folders" / "resumed"
    real_copy = shutil.copy2

    def disk_full(src, dst, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shutil, "copy2", disk_full)
    with pytest.raises(OSError, match="No space left"):
        resume_job(job, previous, out)
    assert not (tmp_path / "new").exists()  # neither the job nor the folders made for it
    monkeypatch.setattr(shutil, "copy2", real_copy)
    assert resume_job(job, previous, out)[0] == out
    assert sorted(p.name for p in out.parent.iterdir()) == ["resumed"]


def test_the_workflow_and_its_persistor_write_a_result_that_resumes(tmp_path):
    """One real round of the workflow with the real persistor: the checkpoint it saves and the progress file it
    writes carry the same run and round, and resume-job accepts the pair."""
    import numpy as np
    import torch
    from nvflare.apis.event_type import EventType
    from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

    from feddg.flare.persistor import FedDGModelPersistor
    from tests.flare.test_controller import RUN as THIS_RUN
    from tests.flare.test_controller import SITES, _controller

    def update(site, params):
        return FLModel(params={k: v + 1 if v.dtype.kind == "f" else v for k, v in params.items()},
                       params_type=ParamsType.FULL,
                       meta={"client_name": site, FedDGMeta.NUM_TRAIN_SAMPLES: 10, FedDGMeta.VAL_DICE: 0.5,
                             FedDGMeta.RUN_ID: THIS_RUN})

    results = []
    ctl, cfg = _controller(tmp_path / "run", results, min_sites=3)
    persistor = FedDGModelPersistor()
    persistor.handle_event(EventType.START_RUN, ctl.fl_ctx)
    ctl.persistor = persistor
    learnable = persistor.load(ctl.fl_ctx)
    initial = {k: np.array(v) for k, v in learnable["weights"].items()}
    sent = FLModel(params=dict(initial), params_type=ParamsType.FULL)
    results += [update(site, initial) for site in SITES]
    assert ctl._run_round(sent, SITES, 3, cfg) is not None

    checkpoint = next((tmp_path / "run").rglob("FL_global_model.pt"))
    progress = json.loads(next((tmp_path / "run").rglob("feddg_progress.json")).read_text())
    meta = torch.load(checkpoint, weights_only=True)["meta_props"]
    assert progress["run_id"] == meta[RUN_ID] and progress["rounds_completed"] == meta[ROUNDS_COMPLETED] == 1
    first = next(iter(initial))
    np.testing.assert_allclose(torch.load(checkpoint, weights_only=True)["model"][first].numpy(), initial[first] + 1,
                               rtol=1e-6)

    job = write_job(tmp_path / "jobs", "prostate_fedavg", cfg.to_dict())
    out, start, total = resume_job(job, tmp_path / "run", tmp_path / "resumed", rounds=3)
    assert (start, total) == (1, 3)
