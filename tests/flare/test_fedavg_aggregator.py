"""SampleSizeAggregator and check_update with real NVFlare FLModel objects."""

import numpy as np
import pytest
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

from feddg.flare.constants import FedDGMeta
from feddg.flare.fedavg.aggregator import SampleSizeAggregator
from feddg.flare.updates import UpdateRejected, check_update


def _result(site: str, value: float, n: int, steps: int = 1) -> FLModel:
    return FLModel(
        params={"w": np.full((2, 2), value, np.float32), "b": np.array([value], np.float32)},
        params_type=ParamsType.FULL,
        meta={"client_name": site, FedDGMeta.NUM_TRAIN_SAMPLES: n, "NUM_STEPS_CURRENT_ROUND": steps},
        current_round=0,
    )


def test_weights_are_data_sizes_counted_once():
    agg = SampleSizeAggregator()
    # N = (10, 30): theta = (10*1 + 30*5) / 40 = 4.0; step counts (3 and 1) must not change it.
    agg.accept_model(_result("A", 1.0, 10, steps=3))
    agg.accept_model(_result("B", 5.0, 30, steps=1))
    out = agg.aggregate_model()
    np.testing.assert_allclose(out.params["w"], np.full((2, 2), 4.0))
    np.testing.assert_allclose(out.params["b"], [4.0])
    assert out.params_type == ParamsType.FULL


def test_reset_stats_starts_a_new_round():
    agg = SampleSizeAggregator()
    agg.accept_model(_result("A", 1.0, 10))
    agg.reset_stats()
    agg.accept_model(_result("B", 7.0, 5))
    np.testing.assert_allclose(agg.aggregate_model().params["b"], [7.0])


@pytest.mark.parametrize("n", [None, 0, -3, float("nan"), True, "12"])
def test_missing_or_bad_sample_count_is_rejected_naming_the_site(n):
    agg = SampleSizeAggregator()
    bad = _result("HK", 1.0, 1)
    bad.meta[FedDGMeta.NUM_TRAIN_SAMPLES] = n
    with pytest.raises(ValueError, match="site HK"):
        agg.accept_model(bad)


def test_aggregate_without_updates_raises():
    with pytest.raises(RuntimeError):
        SampleSizeAggregator().aggregate_model()


REF = {"w": np.zeros((2, 2), np.float32), "n": np.array(3, np.int64)}


def test_check_update_accepts_matching_finite_update():
    check_update({"w": np.ones((2, 2), np.float32), "n": np.array(4, np.int64)}, REF)


@pytest.mark.parametrize(
    "update, message",
    [
        ({"w": np.array([[np.nan, 0], [0, 0]], np.float32), "n": np.array(1)}, "NaN or infinite"),
        ({"w": np.array([[np.inf, 0], [0, 0]], np.float32), "n": np.array(1)}, "NaN or infinite"),
        ({"w": np.zeros((3, 2), np.float32), "n": np.array(1)}, "shape"),
        ({"w": np.zeros((2, 2), np.float32)}, "missing \\['n'\\]"),
        ({"w": np.zeros((2, 2), np.float32), "n": np.array(1), "extra": np.zeros(1)}, "unexpected \\['extra'\\]"),
        ({}, "no parameters"),
        (None, "no parameters"),
    ],
)
def test_check_update_rejects_bad_updates(update, message):
    with pytest.raises(UpdateRejected, match=message):
        check_update(update, REF)


def test_the_average_does_not_depend_on_the_order_of_arrival():
    # float32: (1e8 + 1) - 1e8 = 0 but (1e8 - 1e8) + 1 = 1; summed in arrival order these orders gave 0 and 1/3.
    values = {"A": 1e8, "B": 1.0, "C": -1e8}
    results = []
    for order in (["A", "B", "C"], ["A", "C", "B"], ["C", "B", "A"], ["B", "A", "C"]):
        agg = SampleSizeAggregator()
        for site in order:
            agg.accept_model(_result(site, values[site], 1))
        results.append(agg.aggregate_model().params["w"])
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])
