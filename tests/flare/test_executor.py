"""FedDGExecutor driven with real NVFlare objects (Shareable, DXO, FLContext, Workspace)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from nvflare.apis.dxo import DXO, DataKind, MetaKey, from_shareable
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.shareable import Shareable
from nvflare.apis.signal import Signal

from feddg.experiment import experiment_from_dict
from feddg.flare.constants import FedDGMeta, FedDGTask
from feddg.flare.executor import STATE_DIR, FedDGExecutor
from feddg.flare.ga.hook import GeneralizationGap
from feddg.flare.ga.part import GENERALIZATION_GAP
from feddg.flare.site_hooks import TrainingHook
from feddg.nets.unet import build_model
from tests.conftest import tiny_experiment
from tests.flare.fl_context import make_context


def _context(tmp_path: Path, site: str, exp: dict, components: dict | None = None):
    return make_context(tmp_path, site, exp, components=components)


def _global_weights(exp: dict) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in build_model(experiment_from_dict(exp)).state_dict().items()}


def _task(weights, current_round: int = 0, meta=None) -> Shareable:
    s = DXO(DataKind.WEIGHTS, data=weights, meta=meta or {}).to_shareable()
    s.set_header("current_round", current_round)
    return s


@pytest.fixture
def exp(synthetic_root):
    return tiny_experiment("prostate", root=str(synthetic_root["prostate"]))


def test_train_returns_weights_with_sample_count_and_validation_of_received_model(tmp_path, exp):
    fl_ctx, run_dir = _context(tmp_path, "BIDMC", exp)
    weights = _global_weights(exp)
    result = FedDGExecutor().execute(FedDGTask.TRAIN, _task(weights), fl_ctx, Signal())
    assert result.get_return_code(ReturnCode.OK) == ReturnCode.OK
    dxo = from_shareable(result)
    assert dxo.data_kind == DataKind.WEIGHTS
    assert set(dxo.data) == set(weights)
    assert any(not np.array_equal(dxo.data[k], weights[k]) for k in weights if "conv" in k)
    meta = dxo.meta
    assert meta[FedDGMeta.NUM_TRAIN_SAMPLES] > 0
    assert meta[MetaKey.NUM_STEPS_CURRENT_ROUND] == math.ceil(meta[FedDGMeta.NUM_TRAIN_SAMPLES] / 4)
    assert 0.0 <= meta[FedDGMeta.VAL_DICE] <= 1.0 and math.isfinite(meta[FedDGMeta.VAL_LOSS])
    assert (run_dir / STATE_DIR / "optimizer.pt").exists()


def test_optimizer_state_survives_a_fresh_executor(tmp_path, exp):
    """-t 1 in the simulator: every task runs in a new process, so round 2 must find round 1's Adam moments."""
    import torch

    fl_ctx, run_dir = _context(tmp_path, "BMC", exp)
    weights = _global_weights(exp)
    FedDGExecutor().execute(FedDGTask.TRAIN, _task(weights, 0), fl_ctx, Signal())
    first = torch.load(run_dir / STATE_DIR / "optimizer.pt", weights_only=True)
    steps_first = next(iter(first["state"].values()))["step"].item()
    FedDGExecutor().execute(FedDGTask.TRAIN, _task(weights, 1), fl_ctx, Signal())
    second = torch.load(run_dir / STATE_DIR / "optimizer.pt", weights_only=True)
    assert next(iter(second["state"].values()))["step"].item() == 2 * steps_first


def test_unseen_site_refuses_training_but_evaluates(tmp_path, exp):
    fl_ctx, _ = _context(tmp_path, "RUNMC", exp)
    weights = _global_weights(exp)
    refused = FedDGExecutor().execute(FedDGTask.TRAIN, _task(weights), fl_ctx, Signal())
    assert refused.get_return_code() == ReturnCode.EXECUTION_EXCEPTION
    result = FedDGExecutor().execute(FedDGTask.EVALUATE, _task(weights, meta={FedDGMeta.MODEL_NAME: "final"}),
                                     fl_ctx, Signal())
    dxo = from_shareable(result)
    assert dxo.data_kind == DataKind.METRICS
    assert list(dxo.data) == ["test"]
    prostate = dxo.data["test"]["prostate"]
    for metric in ("dice", "hd95", "asd"):
        assert math.isfinite(prostate[metric]["mean"])
    assert dxo.data["test"]["unit"] == "mm"


def test_training_site_evaluates_its_validation_split(tmp_path, exp):
    fl_ctx, _ = _context(tmp_path, "HK", exp)
    result = FedDGExecutor().execute(FedDGTask.EVALUATE, _task(_global_weights(exp)), fl_ctx, Signal())
    assert "val" in from_shareable(result).data


def test_weights_that_do_not_fit_the_network_are_bad_task_data(tmp_path, exp):
    fl_ctx, _ = _context(tmp_path, "UCL", exp)
    weights = _global_weights(exp)
    weights.pop(next(iter(weights)))
    result = FedDGExecutor().execute(FedDGTask.TRAIN, _task(weights), fl_ctx, Signal())
    assert result.get_return_code() == ReturnCode.BAD_TASK_DATA


def test_non_weight_payload_is_bad_task_data(tmp_path, exp):
    fl_ctx, _ = _context(tmp_path, "UCL", exp)
    task = DXO(DataKind.METRICS, data={"x": 1.0}).to_shareable()
    assert FedDGExecutor().execute(FedDGTask.TRAIN, task, fl_ctx, Signal()).get_return_code() == ReturnCode.BAD_TASK_DATA


def test_unknown_task(tmp_path, exp):
    fl_ctx, _ = _context(tmp_path, "UCL", exp)
    assert FedDGExecutor().execute("nope", Shareable(), fl_ctx, Signal()).get_return_code() == ReturnCode.TASK_UNKNOWN


def test_bad_data_is_reported_before_training(tmp_path, exp):
    """A site whose folder is missing answers with an error naming it; it does not crash the client."""
    exp["data"]["sites"] = [*exp["data"]["sites"], "NEWSITE"]
    fl_ctx, _ = _context(tmp_path, "NEWSITE", exp)
    result = FedDGExecutor().execute(FedDGTask.TRAIN, _task(_global_weights(exp)), fl_ctx, Signal())
    assert result.get_return_code() == ReturnCode.EXECUTION_EXCEPTION


@pytest.mark.parametrize("split", ["val", "train"])
def test_generalization_gap_is_the_received_models_loss_minus_the_previous_local_models_loss(tmp_path, exp, split):
    """Round 0 sends no gap; round 1's gap equals the received model's loss on the split ``ga.gap_split`` names
    minus the loss of the site's own round-0 model there, both computed here independently."""
    import torch

    from feddg.data.dataset import load_site
    from feddg.evaluation import evaluate_sliceset

    exp["ga"] = {"gap_split": split}
    cfg = experiment_from_dict(exp)
    fl_ctx, _ = _context(tmp_path, "HK", exp, {"gap": GeneralizationGap()})
    executor = FedDGExecutor(site_hooks=["gap"])
    round0 = from_shareable(executor.execute(FedDGTask.TRAIN, _task(_global_weights(exp), 0), fl_ctx, Signal()))
    assert GENERALIZATION_GAP not in round0.meta

    images = load_site(cfg.data, "HK")[split]
    assert len(images)

    def loss(weights):
        model = build_model(cfg)
        model.load_state_dict({k: torch.as_tensor(v) for k, v in weights.items()})
        return evaluate_sliceset(model, images, cfg.data.label_names, torch.device("cpu"))["summary"]["loss"]

    global1 = _global_weights(exp)  # a different "global model" for round 1
    round1 = from_shareable(FedDGExecutor(site_hooks=["gap"]).execute(  # a fresh executor: state from the run folder
        FedDGTask.TRAIN, _task(global1, 1), fl_ctx, Signal()))
    expected = loss(global1) - loss(round0.data)
    assert round1.meta[GENERALIZATION_GAP] == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("split, sends", [("val", False), ("train", True)])
def test_without_a_validation_split_only_the_training_split_gap_is_sent(tmp_path, exp, split, sends):
    exp["data"]["val_fraction"] = 0.0
    exp["ga"] = {"gap_split": split}
    fl_ctx, _ = _context(tmp_path, "HK", exp, {"gap": GeneralizationGap()})
    weights = _global_weights(exp)
    FedDGExecutor(site_hooks=["gap"]).execute(FedDGTask.TRAIN, _task(weights, 0), fl_ctx, Signal())
    round1 = FedDGExecutor(site_hooks=["gap"]).execute(FedDGTask.TRAIN, _task(weights, 1), fl_ctx, Signal())
    assert round1.get_return_code(ReturnCode.OK) == ReturnCode.OK
    assert (GENERALIZATION_GAP in from_shareable(round1).meta) is sends


def test_no_gap_unless_the_job_asks_for_it(tmp_path, exp):
    fl_ctx, _ = _context(tmp_path, "HK", exp, {"gap": GeneralizationGap()})  # a component no executor names
    weights = _global_weights(exp)
    FedDGExecutor().execute(FedDGTask.TRAIN, _task(weights, 0), fl_ctx, Signal())
    round1 = from_shareable(FedDGExecutor().execute(FedDGTask.TRAIN, _task(weights, 1), fl_ctx, Signal()))
    assert GENERALIZATION_GAP not in round1.meta


class _Leaky(TrainingHook):
    """A hook that adds a key its part does not declare."""

    def after_training(self, ctx, model):
        return {"site_secret": 1.0}


def test_a_hook_that_adds_an_undeclared_key_stops_the_update_at_the_site(tmp_path, exp):
    fl_ctx, _ = _context(tmp_path, "HK", exp, {"leaky": _Leaky()})
    result = FedDGExecutor(site_hooks=["leaky"]).execute(FedDGTask.TRAIN, _task(_global_weights(exp)), fl_ctx,
                                                         Signal())
    assert result.get_return_code() == ReturnCode.EXECUTION_EXCEPTION


def test_a_hook_id_that_is_no_hook_component_is_named(tmp_path, exp):
    fl_ctx, _ = _context(tmp_path, "HK", exp)
    result = FedDGExecutor(site_hooks=["missing"]).execute(FedDGTask.TRAIN, _task(_global_weights(exp)), fl_ctx,
                                                           Signal())
    assert result.get_return_code() == ReturnCode.EXECUTION_EXCEPTION


def test_weight_difference_is_local_minus_received(tmp_path, exp):
    fl_ctx, _ = _context(tmp_path, "BMC", exp)
    weights = _global_weights(exp)
    plain = from_shareable(FedDGExecutor().execute(FedDGTask.TRAIN, _task(weights), fl_ctx, Signal()))
    fl_ctx2, _ = _context(tmp_path / "again", "BMC", exp)
    diff = from_shareable(FedDGExecutor(send_weight_diff=True).execute(FedDGTask.TRAIN, _task(weights), fl_ctx2,
                                                                        Signal()))
    assert diff.data_kind == DataKind.WEIGHT_DIFF
    for k in weights:  # same seeds, same data: the difference is exactly the trained weights minus the received
        np.testing.assert_allclose(diff.data[k], plain.data[k] - weights[k], atol=1e-6)


def test_site_info_reports_version_and_preprocessing_hash(tmp_path, exp):
    from feddg.flare.site_info import site_fingerprint

    fl_ctx, _ = _context(tmp_path, "BIDMC", exp)
    dxo = from_shareable(FedDGExecutor().execute(FedDGTask.SITE_INFO, Shareable(), fl_ctx, Signal()))
    assert dxo.data_kind == DataKind.METRICS and dxo.data == site_fingerprint(experiment_from_dict(exp))


def test_error_lines_carry_no_paths_but_the_local_log_does(tmp_path, exp, caplog):
    import logging

    exp["data"]["root"] = str(tmp_path / "hospital_share" / "prostate_data")  # no such folder
    fl_ctx, _ = _context(tmp_path, "BIDMC", exp)
    with caplog.at_level(logging.INFO):
        result = FedDGExecutor().execute(FedDGTask.TRAIN, _task(_global_weights(exp)), fl_ctx, Signal())
    assert result.get_return_code() == ReturnCode.EXECUTION_EXCEPTION
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors and all("hospital_share" not in m for m in errors), errors
    assert any("hospital_share" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)


def test_an_unexpected_failure_is_an_error_reply_without_a_traceback_upstream(tmp_path, exp, caplog, monkeypatch):
    import logging

    fl_ctx, _ = _context(tmp_path, "BIDMC", exp)
    ex = FedDGExecutor()
    monkeypatch.setattr(ex, "_setup", lambda _ctx: (_ for _ in ()).throw(RuntimeError("boom in /opt/x/y.py")))
    with caplog.at_level(logging.INFO):
        result = ex.execute(FedDGTask.TRAIN, _task(_global_weights(exp)), fl_ctx, Signal())
    assert result.get_return_code() == ReturnCode.EXECUTION_EXCEPTION
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors and all("/opt/x" not in m and "Traceback" not in m for m in errors), errors
    assert any(m.endswith("task train failed at site BIDMC: RuntimeError: boom in <path>") for m in errors)
    assert any("Traceback" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)


def test_results_name_the_run_this_process_serves_the_first_a_task_named(tmp_path, exp, caplog):
    """The server tells its run's sites from another run's process under the same site name by the run each result
    names: the first run a task named, whatever run a later task names."""
    import logging

    fl_ctx, _ = _context(tmp_path, "RUNMC", exp)
    weights = _global_weights(exp)
    executor = FedDGExecutor()
    info = DXO(DataKind.WEIGHTS, data={}, meta={FedDGMeta.RUN_ID: "run-a"}).to_shareable()
    first = executor.execute(FedDGTask.SITE_INFO, info, fl_ctx, Signal())
    assert from_shareable(first).meta[FedDGMeta.RUN_ID] == "run-a"
    with caplog.at_level(logging.ERROR):
        other = executor.execute(FedDGTask.EVALUATE, _task(weights, meta={FedDGMeta.MODEL_NAME: "final",
                                                                         FedDGMeta.RUN_ID: "run-b"}), fl_ctx, Signal())
    assert from_shareable(other).meta[FedDGMeta.RUN_ID] == "run-a"
    assert "this process serves run run-a, but a task of run run-b reached it" in caplog.text
    unnamed = executor.execute(FedDGTask.EVALUATE, _task(weights, meta={FedDGMeta.MODEL_NAME: "final"}), fl_ctx,
                               Signal())
    assert FedDGMeta.RUN_ID not in from_shareable(unnamed).meta  # a task that names no run gets no run back
    refused = executor.execute(FedDGTask.TRAIN, _task(weights, meta={FedDGMeta.RUN_ID: "run-a"}), fl_ctx, Signal())
    assert refused.get_return_code() == ReturnCode.EXECUTION_EXCEPTION  # an error reply stays one, without a DXO
