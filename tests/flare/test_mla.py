"""MLA's NVFlare pieces with real Shareables, DXOs and FLContexts: the site executor's opt-in, feature and
evaluation tasks, and the server's MLA workflow with every site's executor and FeatureMatrixFilter in the loop."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch
from nvflare.apis.dxo import DXO, DataKind, from_shareable
from nvflare.apis.fl_constant import FilterKey, FLContextKey, ReturnCode
from nvflare.apis.signal import Signal
from nvflare.app_common.abstract.model import make_model_learnable

from feddg.experiment import experiment_from_dict
from feddg.flare.mla.settings import mla_feature_width
from feddg.data.dataset import load_site
from feddg.flare.constants import FedDGMeta, FedDGTask
from feddg.flare.egress_filter import SiteEgressFilter
from feddg.flare.mla.bundle import bundle_to_payload, load_bundle, save_bundle
from feddg.flare.mla.executor import MLAExecutor
from feddg.flare.mla.filter import FeatureMatrixFilter
from feddg.flare.mla.local_models import LOCAL_MODELS_DIR, LocalModelStore
from feddg.flare.mla.payloads import (
    FEATURE_MATRIX,
    MLATask,
    SHARE_LOCAL_MODEL,
    check_feature_payload,
    feature_request_dxo,
    mla_bundle_dxo,
)
from feddg.flare.mla.workflow import MLAWorkflow
from feddg.methods.mla.attention import train_domain_attention
from feddg.methods.mla.encoders import build_feature_encoder, encode
from feddg.nets.unet import build_model
from tests.conftest import tiny_experiment
from tests.flare.federation import Federation
from tests.flare.fl_context import make_context

TRAIN_SITES = ["BIDMC", "BMC", "HK", "I2CVB", "UCL"]
ALL_SITES = ["BIDMC", "BMC", "HK", "I2CVB", "RUNMC", "UCL"]


@pytest.fixture
def exp(synthetic_root):
    e = tiny_experiment("prostate", root=str(synthetic_root["prostate"]))
    e["model"]["bin_levels"] = 3
    e["mla"] = {"encoder_width": 4, "attention_epochs": 5, "attention_conv_channels": 16, "attention_hidden": 8}
    return e


def _weights(exp, seed=0):
    torch.manual_seed(seed)
    return {k: v.numpy() for k, v in build_model(experiment_from_dict(exp)).state_dict().items()}


def _train_task(exp):
    s = DXO(DataKind.WEIGHTS, data=_weights(exp)).to_shareable()
    s.set_header("current_round", 0)
    return s


def _site_file(fl_ctx, content):
    local = fl_ctx.get_engine().get_workspace().get_site_config_dir()
    with open(f"{local}/feddg_site.json", "w") as f:
        f.write(content if isinstance(content, str) else json.dumps(content))


# ---------------------------------------------------------------------- the site: opt-in
def test_only_the_sites_own_file_opts_it_in(tmp_path, exp):
    fl_ctx, _ = make_context(tmp_path, "BIDMC", exp)
    result = MLAExecutor().execute(FedDGTask.TRAIN, _train_task(exp), fl_ctx, Signal())
    assert result.get_return_code(ReturnCode.OK) == ReturnCode.OK
    assert SHARE_LOCAL_MODEL not in from_shareable(result).meta  # no file: not shared
    _site_file(fl_ctx, {"share_local_model": True})
    result = MLAExecutor().execute(FedDGTask.TRAIN, _train_task(exp), fl_ctx, Signal())
    meta = from_shareable(result).meta
    assert meta[SHARE_LOCAL_MODEL] is True and meta[FedDGMeta.NUM_TRAIN_SAMPLES] > 0
    fl_ctx.set_prop(FLContextKey.TASK_NAME, FedDGTask.TRAIN, private=True, sticky=False)
    fl_ctx.set_prop(FLContextKey.FILTER_DIRECTION, FilterKey.OUT, private=True, sticky=False)
    assert SiteEgressFilter().process(result, fl_ctx) is result  # the site policy lets the flag out
    _site_file(fl_ctx, {"share_local_model": False})
    meta = from_shareable(MLAExecutor().execute(FedDGTask.TRAIN, _train_task(exp), fl_ctx, Signal())).meta
    assert SHARE_LOCAL_MODEL not in meta


def test_a_broken_site_file_stops_training_with_its_reason(tmp_path, exp, caplog):
    fl_ctx, _ = make_context(tmp_path, "BIDMC", exp)
    _site_file(fl_ctx, {"share_local_model": "yes"})
    with caplog.at_level(logging.ERROR):
        result = MLAExecutor().execute(FedDGTask.TRAIN, _train_task(exp), fl_ctx, Signal())
    assert result.get_return_code() == ReturnCode.EXECUTION_EXCEPTION
    assert "share_local_model: input should be a valid boolean (got 'yes')" in caplog.text


# ---------------------------------------------------------------------- the site: features
def _request(exp, **kw):
    args = {"in_channels": 1, "seed": 3, "width": 4, "depth": 3, **kw}
    max_images = args.pop("max_images", None)
    return feature_request_dxo("random", max_images, **args).to_shareable()


def test_a_site_sends_one_feature_vector_per_training_image_from_the_shared_encoder(tmp_path, exp):
    fl_ctx, _ = make_context(tmp_path, "BIDMC", exp)
    result = MLAExecutor().execute(MLATask.MLA_FEATURES, _request(exp), fl_ctx, Signal())
    dxo = from_shareable(result)
    assert dxo.data_kind == FEATURE_MATRIX
    x = check_feature_payload(dxo, width=16, max_width=16)
    train = load_site(experiment_from_dict(exp).data, "BIDMC")["train"]
    np.testing.assert_array_equal(x, encode(build_feature_encoder(1, 3, width=4, depth=3), train.images))
    capped = from_shareable(MLAExecutor().execute(MLATask.MLA_FEATURES, _request(exp, max_images=3), fl_ctx,
                                                  Signal())).data["features"]
    assert capped.shape == (3, 16) and all(any(np.array_equal(r, row) for row in x) for r in capped)


def test_the_global_encoder_request_carries_the_final_weights(tmp_path, exp):
    fl_ctx, _ = make_context(tmp_path, "BIDMC", exp)
    request = feature_request_dxo("global", None, weights=_weights(exp)).to_shareable()
    x = from_shareable(MLAExecutor().execute(MLATask.MLA_FEATURES, request, fl_ctx, Signal())).data["features"]
    assert x.shape[1] == exp["model"]["features"][4] and np.isfinite(x).all()


def test_bad_feature_requests_and_the_unseen_site_are_refused(tmp_path, exp, caplog):
    fl_ctx, _ = make_context(tmp_path / "a", "BIDMC", exp)
    with caplog.at_level(logging.ERROR):
        result = MLAExecutor().execute(MLATask.MLA_FEATURES, _request(exp, in_channels=3), fl_ctx, Signal())
    assert result.get_return_code() == ReturnCode.BAD_TASK_DATA and "takes 3 channel(s)" in caplog.text
    wrong = {k: v for k, v in _weights(exp).items() if "final_conv" not in k}
    request = feature_request_dxo("global", None, weights=wrong).to_shareable()
    result = MLAExecutor().execute(MLATask.MLA_FEATURES, request, fl_ctx, Signal())
    assert result.get_return_code() == ReturnCode.BAD_TASK_DATA
    unseen, _ = make_context(tmp_path / "b", "RUNMC", exp)
    with caplog.at_level(logging.ERROR):
        result = MLAExecutor().execute(MLATask.MLA_FEATURES, _request(exp), unseen, Signal())
    assert result.get_return_code() == ReturnCode.EXECUTION_EXCEPTION and "unseen site" in caplog.text


# ---------------------------------------------------------------------- the site: evaluation
@pytest.fixture
def bundle(tmp_path, exp):
    cfg = experiment_from_dict(exp)
    models = {s: _weights(exp, seed=i) for i, s in enumerate(("BIDMC", "HK", "UCL"))}
    encoder = build_feature_encoder(1, 0, width=4)
    bank = {s: encode(encoder, load_site(cfg.data, s)["train"].images) for s in models}
    attention, order, _ = train_domain_attention(bank, epochs=3, conv_channels=8, hidden=8)
    return load_bundle(save_bundle(tmp_path / "bundle", models, encoder, attention, cfg, site_order=order))


def test_every_site_scores_the_combination_its_own_images_weight(tmp_path, exp, bundle):
    task = mla_bundle_dxo(bundle_to_payload(bundle)).to_shareable()
    for site, source in (("RUNMC", "test"), ("BMC", "val")):
        fl_ctx, _ = make_context(tmp_path / site, site, exp)
        dxo = from_shareable(MLAExecutor().execute(MLATask.MLA_EVALUATE, task, fl_ctx, Signal()))
        data = load_site(experiment_from_dict(exp).data, site)
        assert dxo.data_kind == DataKind.METRICS  # the splits the evaluate task scores
        assert sorted(dxo.data) == sorted(s for s in ("val", "test") if len(data[s]))
        assert np.isfinite(dxo.data[source]["prostate"]["dice"]["mean"])
        w = dxo.meta["attention_weights"]
        assert list(w) == bundle.sites and sum(w.values()) == pytest.approx(1.0)
        assert dxo.meta[FedDGMeta.MODEL_NAME] == "mla"
        np.testing.assert_allclose(list(w.values()), bundle.weights(data[source].images, "mean"))


def test_a_broken_bundle_is_refused_with_the_reason(tmp_path, exp, bundle, caplog):
    payload = bundle_to_payload(bundle)
    del payload["local_models"]["HK"]
    fl_ctx, _ = make_context(tmp_path, "RUNMC", exp)
    with caplog.at_level(logging.ERROR):
        result = MLAExecutor().execute(MLATask.MLA_EVALUATE, mla_bundle_dxo(payload).to_shareable(), fl_ctx,
                                       Signal())
    assert result.get_return_code() == ReturnCode.BAD_TASK_DATA
    assert "refused the MLA bundle: MLA bundle payload: no local model for site 'HK'" in caplog.text


# ---------------------------------------------------------------------- the server workflow
def _federation(tmp_path, exp, tamper=None) -> Federation:
    """Every site's real MLA executor; a result passes the site's own policy (privacy.json) first, then the job's
    FeatureMatrixFilter, as NVFlare runs them."""
    width = mla_feature_width(experiment_from_dict(exp))
    return Federation({s: make_context(tmp_path / s, s, exp)[0] for s in ALL_SITES}, MLAExecutor,
                      in_filters=list, out_filters=lambda: [SiteEgressFilter(), FeatureMatrixFilter(max_width=width)],
                      tampered_task=MLATask.MLA_FEATURES, tamper=tamper)


class _Persistor:
    def __init__(self, weights):
        self.weights = weights
        self.global_model_file_name = "FL_global_model.pt"

    def get_model(self, name, _fl_ctx):
        return make_model_learnable(self.weights, {}) if name == "FL_global_model.pt" else None


def _server(tmp_path, exp, federation, kept=TRAIN_SITES, declined=(), persistor=None):
    fl_ctx, run_dir = make_context(tmp_path / "server", "server", exp)
    store = LocalModelStore(run_dir / LOCAL_MODELS_DIR)
    for i, site in enumerate(kept):
        store.save(site, _weights(exp, seed=i), round_=0, num_train_samples=10)
    for site in declined:
        store.decline(site)
    final_row = {"model": "final", "site": "RUNMC", "role": "unseen", "split": "test", "structure": "prostate",
                 "dice": 0.5, "dice_std": 0.0, "hd95": 1.0, "hd95_std": 0.0, "asd": 1.0, "asd_std": 0.0, "n": 3,
                 "empty_pred": 0, "empty_gt": 0, "unit": "mm"}
    (run_dir / "feddg_report.json").write_text(json.dumps({"task": "prostate", "models": {"final": {}},
                                                           "table": [final_row]}))
    fl_ctx.get_engine().get_component = lambda _id: persistor
    wf = MLAWorkflow()
    wf.start_controller(fl_ctx)
    wf.broadcast_and_wait = federation.broadcast_and_wait
    return wf, fl_ctx, run_dir


def _report(run_dir):
    return json.loads((run_dir / "feddg_report.json").read_text())


def test_the_workflow_builds_the_bank_trains_the_attention_writes_the_bundle_and_evaluates_everywhere(
        tmp_path, exp, capsys):
    fed = _federation(tmp_path, exp)
    wf, fl_ctx, run_dir = _server(tmp_path, exp, fed)
    wf.control_flow(Signal(), fl_ctx)
    assert fed.targets == [(MLATask.MLA_FEATURES, TRAIN_SITES), (MLATask.MLA_EVALUATE, ALL_SITES)]
    bundle = load_bundle(run_dir / "mla_bundle")
    assert bundle.sites == TRAIN_SITES and bundle.attention.num_sites == 5
    store = LocalModelStore(run_dir / LOCAL_MODELS_DIR)
    assert all(torch.equal(bundle.local_states["HK"][k], v) for k, v in store.load("HK").items())
    report = _report(run_dir)
    assert report["task"] == "prostate" and "final" in report["models"]  # the FedAvg report is kept
    mla = report["mla"]
    assert mla["skipped"] is None and mla["sites"] == TRAIN_SITES and mla["left_out"] == {}
    assert 0.0 <= mla["attention_accuracy"] <= 1.0 and sorted(mla["attention_site_accuracy"]) == sorted(TRAIN_SITES)
    assert sorted(mla["attention_weights"]) == sorted(ALL_SITES)
    assert sum(mla["attention_weights"]["RUNMC"]["weights"].values()) == pytest.approx(1.0)
    assert mla["attention_weights"]["RUNMC"]["from"] == "test"
    sites = report["models"]["mla"]["sites"]
    assert sorted(sites) == sorted(ALL_SITES) and sites["RUNMC"]["role"] == "unseen"
    assert np.isfinite(sites["RUNMC"]["splits"]["test"]["prostate"]["hd95"]["mean"])
    assert report["table"][0]["model"] == "final" and {r["model"] for r in report["table"][1:]} == {"mla"}
    out = capsys.readouterr().out
    assert "MLA at the unseen site RUNMC" in out and "attention weights at RUNMC" in out
    assert "RUNMC test prostate: Dice final 0.500 / mla " in out


def test_a_site_sending_no_features_is_left_out_of_the_attention_and_the_combination(tmp_path, exp, caplog):
    def send_raw_images(result):
        dxo = from_shareable(result)
        dxo.data["features"] = np.random.default_rng(0).normal(size=(3, 32 * 32)).astype(np.float32)
        dxo.meta.update(num_images=3, width=32 * 32)
        return dxo.to_shareable()

    fed = _federation(tmp_path, exp, tamper={"HK": send_raw_images})
    wf, fl_ctx, run_dir = _server(tmp_path, exp, fed)
    with caplog.at_level(logging.WARNING):
        wf.control_flow(Signal(), fl_ctx)
    assert ("MLA: site HK sent no feature vectors (answered with TASK_RESULT_FILTER_ERROR); it is left out of the "
            "domain attention module and its local model out of the combination") in caplog.text
    bundle = load_bundle(run_dir / "mla_bundle")
    assert bundle.sites == ["BIDMC", "BMC", "I2CVB", "UCL"] and bundle.attention.num_sites == 4
    report = _report(run_dir)
    assert "HK" in report["mla"]["left_out"] and "HK" not in report["mla"]["sites"]
    assert "HK" in report["models"]["mla"]["sites"]  # it still evaluates the combination of the others


def test_a_site_that_did_not_opt_in_is_named_and_never_asked(tmp_path, exp, caplog):
    fed = _federation(tmp_path, exp)
    wf, fl_ctx, run_dir = _server(tmp_path, exp, fed, kept=["BIDMC", "BMC", "HK", "I2CVB"], declined=["UCL"])
    with caplog.at_level(logging.WARNING):
        wf.control_flow(Signal(), fl_ctx)
    assert "MLA: site UCL did not opt in to share its local model; it is left out of MLA" in caplog.text
    assert '"share_local_model": true in its own local/feddg_site.json' in caplog.text
    assert fed.targets[0] == (MLATask.MLA_FEATURES, ["BIDMC", "BMC", "HK", "I2CVB"])
    assert load_bundle(run_dir / "mla_bundle").sites == ["BIDMC", "BMC", "HK", "I2CVB"]
    assert _report(run_dir)["mla"]["left_out"] == {"UCL": "did not opt in to share its local model"}


@pytest.mark.parametrize("case", ["one kept model", "one site with features"])
def test_fewer_than_two_usable_sites_skip_mla_and_keep_the_fedavg_report(tmp_path, exp, caplog, capsys, case):
    if case == "one kept model":
        fed = _federation(tmp_path, exp)
        wf, fl_ctx, run_dir = _server(tmp_path, exp, fed, kept=["BMC"], declined=["BIDMC", "HK", "I2CVB", "UCL"])
    else:
        blocked = {s: (lambda r: DXO(DataKind.WEIGHTS, {"w": np.zeros(1)}).to_shareable()) for s in TRAIN_SITES[1:]}
        fed = _federation(tmp_path, exp, tamper=blocked)
        wf, fl_ctx, run_dir = _server(tmp_path, exp, fed)
    wf.panics = []
    wf.system_panic = lambda reason, _ctx: wf.panics.append(reason)
    with caplog.at_level(logging.WARNING):
        wf.control_flow(Signal(), fl_ctx)
    assert wf.panics == [] and "MLA skipped" in caplog.text and "The job's FedAvg results stand" in caplog.text
    assert not (run_dir / "mla_bundle").exists()
    assert all(name != MLATask.MLA_EVALUATE for name, _ in fed.targets)
    report = _report(run_dir)
    assert report["mla"]["skipped"] and "mla" not in report["models"] and "final" in report["models"]
    assert "MLA skipped" in capsys.readouterr().out


def test_the_global_encoder_comes_from_the_persistors_final_model(tmp_path, exp):
    exp["mla"]["encoder"] = "global"
    fed = _federation(tmp_path, exp)
    wf, fl_ctx, run_dir = _server(tmp_path, exp, fed, kept=["BIDMC", "BMC"], persistor=_Persistor(_weights(exp, 7)))
    wf.control_flow(Signal(), fl_ctx)
    bundle = load_bundle(run_dir / "mla_bundle")
    assert bundle.manifest["encoder"]["kind"] == "global_model"
    final = _weights(exp, 7)
    assert all(np.array_equal(v.numpy(), final[k]) for k, v in bundle.encoder.state_dict().items())
    assert _report(run_dir)["mla"]["feature_width"] == exp["model"]["features"][4]


def test_the_global_encoder_without_a_final_model_skips_mla(tmp_path, exp, caplog):
    exp["mla"]["encoder"] = "global"
    fed = _federation(tmp_path, exp)
    wf, fl_ctx, run_dir = _server(tmp_path, exp, fed, persistor=None)
    with caplog.at_level(logging.WARNING):
        wf.control_flow(Signal(), fl_ctx)
    assert "final global model is not available" in caplog.text and fed.targets == []
