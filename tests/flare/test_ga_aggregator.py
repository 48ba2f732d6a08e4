"""GeneralizationAdjustmentAggregator with real NVFlare objects (FLModel, FLContext carrying the round)."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest
from nvflare.apis.event_type import EventType
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
from nvflare.app_common.app_constant import AppConstants

from feddg.flare.ga.aggregator import GeneralizationAdjustmentAggregator
from feddg.flare.ga.part import GENERALIZATION_GAP
from tests.conftest import tiny_experiment
from tests.flare.fl_context import make_context

SITES = ["A", "B", "C"]


@pytest.fixture
def aggregator(tmp_path):
    exp = tiny_experiment("prostate")
    exp["data"].update(sites=[*SITES, "U"], unseen_site="U")
    exp["train"]["rounds"] = 10
    fl_ctx, run_dir = make_context(tmp_path, "server", exp)
    agg = GeneralizationAdjustmentAggregator()
    agg.handle_event(EventType.START_RUN, fl_ctx)
    agg.run_dir = run_dir
    return agg


def _result(site: str, value: float, gap=None) -> FLModel:
    meta = {"client_name": site}
    if gap is not None:
        meta[GENERALIZATION_GAP] = gap
    return FLModel(params={"w": np.full(2, value, np.float32)}, params_type=ParamsType.FULL, meta=meta)


def _round(agg, r: int, results) -> FLModel:
    agg.fl_ctx.set_prop(AppConstants.CURRENT_ROUND, r, private=True, sticky=False)
    agg.reset_stats()
    for res in results:
        agg.accept_model(res)
    return agg.aggregate_model()


def test_round_zero_is_uniform_not_data_size_weighted(aggregator):
    out = _round(aggregator, 0, [_result("A", 0.0), _result("B", 3.0), _result("C", 6.0)])
    np.testing.assert_allclose(out.params["w"], [3.0, 3.0])  # (0 + 3 + 6) / 3
    assert out.meta["ga_weights"] == pytest.approx({s: 1 / 3 for s in SITES})
    assert out.meta["ga_gaps"] == {} and out.meta["ga_step"] == pytest.approx(0.05)  # round 0: no gaps, d^0 = d


def test_gaps_move_the_weights_with_the_decayed_step(aggregator):
    _round(aggregator, 0, [_result(s, 0.0) for s in SITES])
    # r = 1, R = 10: d^1 = 0.045. G = (0.30, 0.15, 0.45): a = 1/3 + 0.045 * (0, -1, 1)
    out = _round(aggregator, 1, [_result("A", 0.0, 0.30), _result("B", 0.0, 0.15), _result("C", 1.0, 0.45)])
    expected = {"A": 1 / 3, "B": 1 / 3 - 0.045, "C": 1 / 3 + 0.045}
    assert out.meta["ga_weights"] == pytest.approx(expected)
    assert out.meta["ga_gaps"] == {"A": 0.30, "B": 0.15, "C": 0.45} and out.meta["ga_step"] == pytest.approx(0.045)
    np.testing.assert_allclose(out.params["w"], [expected["C"]] * 2, rtol=1e-6)
    history = json.loads((aggregator.run_dir / "ga_weights.json").read_text())
    assert [h["round"] for h in history["history"]] == [0, 1]
    assert history["history"][1]["step"] == pytest.approx(0.045)
    assert all(math.isclose(sum(h["weights"].values()), 1.0) for h in history["history"])


def test_the_step_size_is_the_jobs_ga_step_size(tmp_path):
    exp = tiny_experiment("prostate")
    exp["data"].update(sites=[*SITES, "U"], unseen_site="U")
    exp["train"]["rounds"] = 10
    exp["ga"] = {"step_size": 0.2}
    fl_ctx, _ = make_context(tmp_path, "server", exp)
    agg = GeneralizationAdjustmentAggregator()
    agg.handle_event(EventType.START_RUN, fl_ctx)
    _round(agg, 0, [_result(s, 0.0) for s in SITES])
    out = _round(agg, 1, [_result("A", 0.0, 0.30), _result("B", 0.0, 0.15), _result("C", 1.0, 0.45)])
    # d^1 = (1 - 1/10) * 0.2 = 0.18
    assert out.meta["ga_weights"] == pytest.approx({"A": 1 / 3, "B": 1 / 3 - 0.18, "C": 1 / 3 + 0.18})


def test_invalid_gap_keeps_weight_with_one_warning_naming_the_site(aggregator, caplog):
    _round(aggregator, 0, [_result(s, 0.0) for s in SITES])
    with caplog.at_level(logging.WARNING):
        out = _round(aggregator, 1, [_result("A", 0.0, float("nan")), _result("B", 0.0, 0.1), _result("C", 0.0, 0.3)])
    assert out.meta["ga_weights"]["A"] == pytest.approx(1 / 3)
    assert out.meta["ga_gaps"] == {"B": 0.1, "C": 0.3}  # the invalid gap is left out
    assert [r for r in caplog.records if "site A" in r.getMessage()]


def test_absent_site_keeps_its_weight_for_when_it_returns(aggregator):
    _round(aggregator, 0, [_result(s, 0.0) for s in SITES])
    _round(aggregator, 1, [_result("A", 0.0, 0.1), _result("B", 0.0, 0.2), _result("C", 0.0, 0.6)])
    kept = aggregator._weights["C"]
    out = _round(aggregator, 2, [_result("A", 0.0, 0.1), _result("B", 1.0, 0.3)])  # C is missing
    assert set(out.meta["ga_weights"]) == {"A", "B"} and sum(out.meta["ga_weights"].values()) == pytest.approx(1)
    assert aggregator._weights["C"] == pytest.approx(kept)
    assert sum(aggregator._weights.values()) == pytest.approx(1)


def test_unknown_site_is_rejected(aggregator):
    with pytest.raises(ValueError, match="site U"):
        aggregator.accept_model(_result("U", 0.0))


def test_history_resumes_after_a_restart(tmp_path, aggregator):
    _round(aggregator, 0, [_result(s, 0.0) for s in SITES])
    _round(aggregator, 1, [_result("A", 0.0, 0.1), _result("B", 0.0, 0.2), _result("C", 0.0, 0.6)])
    saved = aggregator.run_dir / "ga_weights.json"
    exp = tiny_experiment("prostate")
    exp["data"].update(sites=[*SITES, "U"], unseen_site="U")
    exp["train"]["rounds"] = 10
    fl_ctx, _ = make_context(tmp_path / "restart", "server", exp, job_id="job2")
    resumed = GeneralizationAdjustmentAggregator(resume_from=str(saved))
    resumed.handle_event(EventType.START_RUN, fl_ctx)
    assert resumed._weights == pytest.approx(aggregator._weights)
    out = _round(resumed, 2, [_result(s, 0.0, 0.2) for s in SITES])
    assert [h["round"] for h in json.loads((tmp_path / "restart" / "ws" / "server" / "job2" / "ga_weights.json")
                                           .read_text())["history"]] == [0, 1, 2]
    assert out.meta["ga_weights"] == pytest.approx(aggregator._weights)  # equal gaps: no change
