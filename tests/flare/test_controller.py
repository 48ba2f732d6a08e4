"""One round of the leave-one-site-out workflow with real FLModel/FLContext objects; the broadcast to the sites is
replaced by prepared results, everything after it (checks, aggregation, best model, saving) runs for real."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

from feddg.experiment import experiment_from_dict
from feddg.flare.constants import FedDGMeta
from feddg.flare.controller import LeaveOneSiteOutFedAvg
from feddg.flare.fedavg.aggregator import SampleSizeAggregator
from tests.conftest import tiny_experiment
from tests.flare.fl_context import make_context
from feddg.flare.mla.payloads import SHARE_LOCAL_MODEL

SITES = ["A", "B", "C"]
RUN = "this-run"  # the controller's run id in these tests (drawn at random in a real run)


class RecordingPersistor:
    def __init__(self):
        self.saved = []

    def save(self, learnable, _fl_ctx):
        self.saved.append(learnable)


def _controller(tmp_path, results, min_sites):
    exp = tiny_experiment("prostate", min_sites=min_sites)
    exp["data"].update(sites=[*SITES, "U"], unseen_site="U")
    cfg = experiment_from_dict(exp)
    fl_ctx, _ = make_context(tmp_path, "server", exp)
    ctl = LeaveOneSiteOutFedAvg()
    ctl.fl_ctx, ctl.engine = fl_ctx, fl_ctx.get_engine()
    ctl.aggregator = SampleSizeAggregator()
    ctl.persistor = RecordingPersistor()
    ctl.num_rounds, ctl.current_round = 3, 0
    ctl.panics = []
    ctl.panic = ctl.panics.append
    ctl._run_id = RUN
    ctl.broadcast_model = _as_nvflare_broadcasts(ctl, results)
    return ctl, cfg


def _as_nvflare_broadcasts(ctl, results):
    """A broadcast that hands ``results`` back as NVFlare's does: with a callback, each result goes through it and
    the broadcast returns what the callback collected."""

    def broadcast_model(callback=None, **_):
        ctl._results = []
        for result in results:
            if callback is not None:
                callback(result)
            else:
                ctl._results.append(result)
        out, ctl._results = ctl._results, []
        return out

    return broadcast_model


def _global():
    return FLModel(params={"w": np.zeros(2, np.float32), "n": np.array(0, np.int64)}, params_type=ParamsType.FULL)


def _update(site, value, n=10, val_dice=0.5):
    return FLModel(params={"w": np.full(2, value, np.float32), "n": np.array(3, np.int64)},
                   params_type=ParamsType.FULL,
                   meta={"client_name": site, FedDGMeta.NUM_TRAIN_SAMPLES: n, FedDGMeta.VAL_DICE: val_dice,
                         FedDGMeta.RUN_ID: RUN})


def test_nan_update_is_rejected_naming_the_site_and_the_round_goes_on(tmp_path, caplog):
    bad = _update("B", np.nan)
    ctl, cfg = _controller(tmp_path, [_update("A", 1.0), bad, _update("C", 3.0, n=30)], min_sites=2)
    with caplog.at_level(logging.ERROR):
        model = ctl._run_round(_global(), SITES, 2, cfg)
    assert any("site B" in r.getMessage() and "NaN" in r.getMessage() for r in caplog.records)
    np.testing.assert_allclose(model.params["w"], [2.5, 2.5])  # (10 * 1 + 30 * 3) / 40, B left out
    assert model.params["n"].dtype == np.int64  # integer buffers keep their dtype after averaging
    assert len(ctl.persistor.saved) == 1 and not ctl.panics


def test_mismatched_update_is_rejected(tmp_path, caplog):
    wrong = _update("C", 1.0)
    wrong.params["w"] = np.zeros(3, np.float32)
    ctl, cfg = _controller(tmp_path, [_update("A", 1.0), _update("B", 1.0), wrong], min_sites=2)
    with caplog.at_level(logging.ERROR):
        ctl._run_round(_global(), SITES, 2, cfg)
    assert any("site C" in r.getMessage() and "shape" in r.getMessage() for r in caplog.records)


def test_too_few_usable_updates_stop_the_job_and_keep_the_last_model(tmp_path):
    ctl, cfg = _controller(tmp_path, [_update("A", 1.0), _update("B", np.inf), _update("C", 1.0)], min_sites=3)
    assert ctl._run_round(_global(), SITES, 3, cfg) is None
    assert ctl.panics and "at least 3" in ctl.panics[0]
    assert ctl.persistor.saved == []  # nothing from this round reaches the checkpoint


def test_missing_site_is_named_and_the_others_are_averaged(tmp_path, caplog):
    ctl, cfg = _controller(tmp_path, [_update("A", 1.0), _update("C", 3.0)], min_sites=2)
    with caplog.at_level(logging.WARNING):
        model = ctl._run_round(_global(), SITES, 2, cfg)
    assert any("['B']" in r.getMessage() for r in caplog.records)
    np.testing.assert_allclose(model.params["w"], [2.0, 2.0])


def _connection_event(ctl, event_type, site):
    """Fire NVFlare's verdict on ``site``'s connection at the controller, as its task monitor does."""
    from nvflare.apis.event_type import EventType
    from nvflare.apis.fl_constant import FLContextKey

    key = (FLContextKey.DISCONNECTED_CLIENT_NAME if event_type == EventType.CLIENT_DISCONNECTED
           else FLContextKey.RECONNECTED_CLIENT_NAME)
    ctl.fl_ctx.set_prop(key, site, private=True, sticky=False)
    ctl.handle_event(event_type, ctl.fl_ctx)


def test_a_site_nvflare_declares_disconnected_gets_no_tasks_and_is_named_with_its_round(tmp_path):
    from nvflare.apis.event_type import EventType

    sent_to = []
    ctl, cfg = _controller(tmp_path, [_update("A", 1.0), _update("C", 3.0)], min_sites=2)
    ctl.broadcast_model = lambda targets, **_: sent_to.append(list(targets)) or [
        _update("A", 1.0), _update("C", 3.0)]
    ctl.current_round = 1
    _connection_event(ctl, EventType.CLIENT_DISCONNECTED, "B")
    assert ctl._run_round(_global(), SITES, 2, cfg) is not None
    assert sent_to == [["A", "C"]]
    assert [{k: e[k] for k in ("site", "round", "rejoined_round")} for e in ctl._lost] == [
        {"site": "B", "round": 1, "rejoined_round": None}]
    ctl.current_round = 2
    _connection_event(ctl, EventType.CLIENT_RECONNECTED, "B")
    assert ctl.connected(SITES) == SITES and ctl._lost[0]["rejoined_round"] == 2
    # one more site gone leaves fewer than the minimum: the job stops naming both
    _connection_event(ctl, EventType.CLIENT_DISCONNECTED, "A")
    _connection_event(ctl, EventType.CLIENT_DISCONNECTED, "C")
    assert ctl._run_round(_global(), SITES, 2, cfg) is None
    assert "['A', 'C'] disconnected" in ctl.panics[0] and "train.min_sites" in ctl.panics[0]


def test_a_lost_site_is_reported_missing_in_the_evaluation_not_scored(tmp_path):
    from nvflare.apis.event_type import EventType

    ctl, cfg = _controller(tmp_path, [], min_sites=1)
    metrics = {"test": {"dice": {"prostate": {"mean": 0.7}}}}
    asked = []

    def broadcast_model(targets, **_):
        asked.append(list(targets))
        return [FLModel(params={}, metrics=metrics, meta={"client_name": s, FedDGMeta.RUN_ID: RUN}) for s in targets]

    ctl.broadcast_model = broadcast_model
    _connection_event(ctl, EventType.CLIENT_DISCONNECTED, "U")  # the unseen site itself
    evaluation = ctl._evaluate({"w": np.zeros(2)}, "final", 3, cfg)
    assert asked == [SITES] and evaluation["missing_sites"] == ["U"] and "U" not in evaluation["sites"]
    for site in [*SITES]:
        _connection_event(ctl, EventType.CLIENT_DISCONNECTED, site)
    assert ctl._evaluate({"w": np.zeros(2)}, "final", 3, cfg) is None and "no site is connected" in ctl.panics[-1]


def test_best_model_follows_the_mean_validation_dice_of_the_received_model(tmp_path):
    ctl, cfg = _controller(tmp_path, [_update(s, 1.0, val_dice=d) for s, d in zip(SITES, (0.2, 0.4, 0.6))], 3)
    sent = _global()
    ctl._run_round(sent, SITES, 3, cfg)
    assert ctl._best["round"] == 0 and ctl._best["score"] == pytest.approx(0.4)
    np.testing.assert_allclose(ctl._best["params"]["w"], [0.0, 0.0])  # the model the sites scored, not the new one



class _ReportingAggregator(SampleSizeAggregator):
    """FedAvg whose aggregate's metadata carries diagnostics of every kind, JSON-safe or not."""

    def aggregate_model(self) -> FLModel:
        out = super().aggregate_model()
        out.meta.update(weights={"A": 0.25, "C": 0.75}, step=np.float32(0.5), note="fine", order=["A", "C"],
                        flags=[True, None], array=np.zeros(2), nan=float("nan"), gaps={"A": 0.1, "C": math.inf},
                        odd=object(), mixed=[1, object()])
        return out


def test_the_round_history_carries_the_aggregates_json_safe_diagnostics(tmp_path):
    ctl, cfg = _controller(tmp_path, [_update("A", 1.0), _update("C", 3.0)], min_sites=2)
    ctl.aggregator = _ReportingAggregator()
    ctl._run_round(_global(), SITES, 2, cfg)
    entry = ctl._history[-1]
    assert entry["aggregation"] == {"weights": {"A": 0.25, "C": 0.75}, "step": 0.5, "note": "fine",
                                    "order": ["A", "C"], "flags": [True, None], "gaps": {"A": 0.1}}
    json.dumps(entry, allow_nan=False)  # as the report is written


def test_an_aggregator_without_diagnostics_leaves_an_empty_aggregation_entry(tmp_path):
    ctl, cfg = _controller(tmp_path, [_update("A", 1.0), _update("C", 3.0)], min_sites=2)
    ctl._run_round(_global(), SITES, 2, cfg)
    assert ctl._history[-1]["aggregation"] == {}  # FedAvg reports only nr_aggregated, which is left out


# ---------------------------------------------------------------------- local models kept for MLA
def _keeping_controller(tmp_path, results, keep=True, num_rounds=1):
    """A controller handing the final round to MLA's LocalModelKeeper when ``keep``, as an MLA job's config makes
    it."""
    from nvflare.apis.event_type import EventType

    from feddg.flare.mla.local_models import LocalModelKeeper

    ctl, cfg = _controller(tmp_path, results, min_sites=1)
    if keep:
        ctl.final_round_receiver = LocalModelKeeper()
        ctl.final_round_receiver.handle_event(EventType.START_RUN, ctl.fl_ctx)
    ctl.num_rounds = num_rounds
    return ctl, cfg


def _shared(site, value, **kw):
    u = _update(site, value, **kw)
    u.meta[SHARE_LOCAL_MODEL] = True
    return u


def _store(tmp_path):
    from feddg.flare.mla.local_models import LOCAL_MODELS_DIR, LocalModelStore

    return LocalModelStore(tmp_path / "ws" / "server" / "job1" / LOCAL_MODELS_DIR)


def test_the_final_round_keeps_the_local_models_of_opted_in_sites_only(tmp_path, caplog):
    import torch

    ctl, cfg = _keeping_controller(tmp_path, [_shared("A", 1.0), _update("B", 2.0), _shared("C", 3.0, n=30)])
    with caplog.at_level(logging.INFO):
        model = ctl._run_round(_global(), SITES, 1, cfg)
    np.testing.assert_allclose(model.params["w"], [2.4, 2.4])  # B still trains with everyone: (10+20+90)/50
    store = _store(tmp_path)
    assert store.sites() == ["A", "C"] and store.declined() == ["B"]
    assert torch.equal(store.load("C")["w"], torch.full((2,), 3.0))
    assert store.load("A")["n"].dtype == torch.int64
    assert store.index()["sites"]["C"]["num_train_samples"] == 30
    line = next(r.getMessage() for r in caplog.records if "site B did not opt in" in r.getMessage())
    assert "MLA will leave B out" in line and '"share_local_model": true in its own local/feddg_site.json' in line


def test_a_weight_diff_update_is_kept_as_received_global_plus_difference(tmp_path):
    import torch
    from nvflare.app_common.abstract.fl_model import ParamsType

    diff = _shared("A", 0.5)
    diff.params_type = ParamsType.DIFF
    diff.params["n"] = np.array(2, np.int64)
    ctl, cfg = _keeping_controller(tmp_path, [diff, _shared("B", 0.5)])
    sent = _global()
    sent.params["w"] = np.array([1.0, 2.0], np.float32)
    sent.params["n"] = np.array(5, np.int64)
    ctl._run_round(sent, SITES, 1, cfg)
    kept = _store(tmp_path).load("A")
    assert torch.equal(kept["w"], torch.tensor([1.5, 2.5])) and kept["w"].dtype == torch.float32
    assert int(kept["n"]) == 7 and kept["n"].dtype == torch.int64


def test_rejected_updates_and_earlier_rounds_are_not_kept(tmp_path):
    ctl, cfg = _keeping_controller(tmp_path, [_shared("A", 1.0), _shared("B", np.nan), _shared("C", 1.0)],
                                   num_rounds=2)
    ctl._run_round(_global(), SITES, 1, cfg)  # round 0 of 2: not the final round
    assert _store(tmp_path).sites() == []
    ctl.current_round = 1
    ctl._run_round(_global(), SITES, 1, cfg)
    assert _store(tmp_path).sites() == ["A", "C"]  # B's NaN update is rejected, so it is not kept either


def test_an_update_the_aggregator_refuses_is_forgotten(tmp_path):
    no_count = _shared("B", 1.0)
    del no_count.meta[FedDGMeta.NUM_TRAIN_SAMPLES]  # SampleSizeAggregator refuses it
    ctl, cfg = _keeping_controller(tmp_path, [_shared("A", 1.0), no_count])
    ctl._run_round(_global(), SITES, 1, cfg)
    assert _store(tmp_path).sites() == ["A"]


def test_without_a_final_round_receiver_nothing_is_kept(tmp_path):
    ctl, cfg = _keeping_controller(tmp_path, [_shared("A", 1.0), _shared("B", 1.0)], keep=False)
    model = ctl._run_round(_global(), SITES, 1, cfg)
    assert model is not None and not (tmp_path / "ws" / "server" / "job1" / "mla_local_models").exists()


def _site_info(site, version="0.1.0", digest="aaaa"):
    return FLModel(params={}, metrics={"feddg_version": version, "preprocessing_hash": digest},
                   meta={"client_name": site, FedDGMeta.RUN_ID: RUN})


def test_job_start_refuses_to_train_when_sites_differ_naming_them(tmp_path):
    ctl, cfg = _controller(tmp_path, [], min_sites=None)
    ctl.broadcast_model = lambda **kw: [_site_info("A"), _site_info("B"), _site_info("C", digest="bbbb"),
                                        _site_info("U")] if kw["task_name"] == "site_info" else []
    assert ctl._sites_agree(cfg) is False
    assert len(ctl.panics) == 1
    assert "['A', 'B', 'U'] run feddg 0.1.0 with preprocessing aaaa" in ctl.panics[0]
    assert "['C'] run feddg 0.1.0 with preprocessing bbbb" in ctl.panics[0]


def test_job_start_goes_on_when_sites_agree_and_names_silent_ones(tmp_path, caplog):
    ctl, cfg = _controller(tmp_path, [], min_sites=None)
    ctl.broadcast_model = lambda **kw: [_site_info("A"), _site_info("B"), _site_info("U")]
    with caplog.at_level(logging.WARNING):
        assert ctl._sites_agree(cfg) is True
    assert ctl.panics == [] and "no version/preprocessing report from ['C']" in caplog.text


# ---------------------------------------------------------------------- answers from another run's process
def _of_run(model: FLModel, run) -> FLModel:
    model.meta[FedDGMeta.RUN_ID] = run
    if run is None:
        del model.meta[FedDGMeta.RUN_ID]
    return model


@pytest.mark.parametrize("run", ["another-run", None])
def test_a_training_result_of_another_run_is_left_out_naming_the_site_and_both_runs(tmp_path, caplog, run):
    """A process of another simulator run on this host answering under site B's name: its update never reaches the
    average (nor MLA's receiver), and the round goes on as without B's answer."""
    ctl, cfg = _keeping_controller(tmp_path, [_shared("A", 1.0), _of_run(_shared("B", 100.0), run),
                                              _shared("C", 3.0, n=30)])
    with caplog.at_level(logging.WARNING):
        model = ctl._run_round(_global(), SITES, 2, cfg)
    np.testing.assert_allclose(model.params["w"], [2.5, 2.5])  # (10 * 1 + 30 * 3) / 40: B's 100 left out
    assert _store(tmp_path).sites() == ["A", "C"]
    line = next(r.getMessage() for r in caplog.records if "answer under site B" in r.getMessage())
    whose = f"serves run {run}" if run is not None else "names no run"
    assert f"comes from a process that {whose}, not this run {RUN}" in line and "left out" in line
    assert any("no result from ['B']" in r.getMessage() for r in caplog.records)
    assert ctl._history[-1]["sites"] == ["A", "C"]


def test_the_models_sent_name_this_run_even_when_a_resumed_checkpoint_names_the_last(tmp_path):
    sent = []
    ctl, cfg = _controller(tmp_path, [_update("A", 1.0), _update("B", 1.0), _update("C", 1.0)], min_sites=3)
    ctl.broadcast_model = lambda data, **_: sent.append(dict(data.meta)) or [_update(s, 1.0) for s in SITES]
    resumed = _global()
    resumed.meta = {FedDGMeta.RUN_ID: "the-run-that-saved-it"}
    ctl._run_round(resumed, SITES, 3, cfg)
    ctl._evaluate({"w": np.zeros(2)}, "final", 1, cfg)
    assert [m[FedDGMeta.RUN_ID] for m in sent] == [RUN, RUN]


def test_an_evaluation_of_another_run_is_left_out_and_the_site_reported_missing(tmp_path, caplog):
    ctl, cfg = _controller(tmp_path, [], min_sites=1)
    metrics = {"test": {"dice": {"prostate": {"mean": 0.7}}}}
    ctl.broadcast_model = lambda targets, **_: [
        FLModel(params={}, metrics=metrics, meta={"client_name": s, FedDGMeta.RUN_ID: "x" if s == "U" else RUN})
        for s in targets]
    with caplog.at_level(logging.ERROR):
        evaluation = ctl._evaluate({"w": np.zeros(2)}, "final", 3, cfg)
    assert sorted(evaluation["sites"]) == SITES and evaluation["missing_sites"] == ["U"]
    assert any("evaluation of the final model: the answer under site U comes from a process that serves run x"
               in r.getMessage() for r in caplog.records)


def test_a_site_info_answer_of_another_run_does_not_count_as_the_sites(tmp_path, caplog):
    ctl, cfg = _controller(tmp_path, [], min_sites=None)
    ctl.broadcast_model = lambda **kw: [_site_info("A"), _site_info("B"), _site_info("U"),
                                        _of_run(_site_info("C", digest="bbbb"), "x")]
    with caplog.at_level(logging.WARNING):
        assert ctl._sites_agree(cfg) is True  # C's other-run answer neither disagrees nor counts
    assert "no version/preprocessing report from ['C']" in caplog.text and "job start: the answer under site C" in caplog.text
