"""GradientAlignmentAggregator with real FLModel objects, alone and inside a workflow round."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

from nvflare.apis.event_type import EventType

from feddg.flare.constants import FedDGMeta
from feddg.flare.gradalign.aggregator import GradientAlignmentAggregator
from feddg.methods.gradalign import align, align_updates, random_orders
from tests.conftest import tiny_experiment
from tests.flare.fl_context import make_context
from tests.flare.test_controller import RUN, _controller


def _started(tmp_path, seed=0, **gradalign) -> GradientAlignmentAggregator:
    """An aggregator that has read a job's feddg.yaml at the start of the run, as in a job."""
    exp = tiny_experiment("prostate", seed=seed)
    exp["gradalign"] = gradalign
    fl_ctx, _ = make_context(tmp_path, "server", exp)
    agg = GradientAlignmentAggregator()
    agg.handle_event(EventType.START_RUN, fl_ctx)
    return agg


def _diff(site, w, n=3, running=(0.0,)):
    return FLModel(params={"conv.weight": np.asarray(w, np.float32), "bn.running_mean": np.asarray(running, np.float32),
                           "bn.num_batches_tracked": np.array(n, np.int64)},
                   params_type=ParamsType.DIFF, meta={"client_name": site})


def _aggregate(agg, results):
    agg.reset_stats()
    for r in results:
        agg.accept_model(r)
    return agg.aggregate_model()


def test_conflicting_updates_are_aligned_with_the_seeded_order(tmp_path):
    g = np.array([[1.0, 0.0], [-1.0, 1.0], [0.0, -1.0]])
    agg = _started(tmp_path, seed=7, lam=0.2)  # lambda from the gradalign section, the seed from train.seed
    out = _aggregate(agg, [_diff(s, row) for s, row in zip("ABC", g)])
    orders = random_orders(3, np.random.default_rng([7, 0]))
    expected = align_updates(g, 0.2, orders).mean(axis=0)
    assert out.params_type == ParamsType.DIFF
    np.testing.assert_allclose(out.params["conv.weight"], expected, rtol=1e-6)
    assert not np.allclose(out.params["conv.weight"], g.mean(axis=0))
    # Every site meets a conflict in any order (<g_1, g_2> = <g_2, g_3> = -1); the count is the math's own.
    assert out.meta["gradalign_corrections"] == align(g, 0.2, orders).corrections > 0
    assert out.meta["gradalign_corrected_sites"] == ["A", "B", "C"]


def test_buffers_and_running_stats_are_averaged_plainly(tmp_path):
    # running_mean values conflict (opposite signs) but must not be aligned: plain mean 0.
    out = _aggregate(GradientAlignmentAggregator(), [_diff("A", [1, 0], 2, (1.0,)), _diff("B", [0, 1], 4, (-1.0,))])
    np.testing.assert_allclose(out.params["bn.running_mean"], [0.0])
    assert out.params["bn.num_batches_tracked"] == pytest.approx(3.0)
    aligned = _started(tmp_path, average_norm_stats=False).aligned_keys(_diff("A", [1, 0]).params)
    assert aligned == ["conv.weight", "bn.running_mean"]


def test_full_weights_are_refused_naming_the_site():
    model = FLModel(params={"w": np.zeros(2)}, params_type=ParamsType.FULL, meta={"client_name": "HK"})
    with pytest.raises(ValueError, match="site HK"):
        GradientAlignmentAggregator().accept_model(model)


def test_single_site_gives_its_own_update():
    out = _aggregate(GradientAlignmentAggregator(), [_diff("A", [0.5, -2.0])])
    np.testing.assert_allclose(out.params["conv.weight"], [0.5, -2.0])


def test_in_a_round_a_nan_update_is_rejected_and_never_added(tmp_path, caplog):
    def update(site, w):
        return FLModel(params={"w": np.asarray(w, np.float32), "n": np.array(1, np.int64)},
                       params_type=ParamsType.DIFF,
                       meta={"client_name": site, "num_train_samples": 5, FedDGMeta.RUN_ID: RUN})

    results = [update("A", [1.0, 0.0]), update("B", [np.nan, 1.0]), update("C", [0.0, -1.0])]
    ctl, cfg = _controller(tmp_path, results, min_sites=2)
    ctl.aggregator = GradientAlignmentAggregator()
    start = FLModel(params={"w": np.array([10.0, 10.0], np.float32), "n": np.array(0, np.int64)},
                    params_type=ParamsType.FULL)
    with caplog.at_level(logging.ERROR):
        model = ctl._run_round(start, ["A", "B", "C"], 2, cfg)
    assert any("site B" in r.getMessage() for r in caplog.records)
    # A and C do not conflict (<(1,0),(0,-1)> = 0): plain mean (0.5, -0.5) added to the global model.
    np.testing.assert_allclose(model.params["w"], [10.5, 9.5])
    assert np.all(np.isfinite(model.params["w"]))
    assert ctl._history[-1]["aggregation"] == {"gradalign_corrections": 0, "gradalign_corrected_sites": []}
