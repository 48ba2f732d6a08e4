"""UniformAggregator with real NVFlare FLModel objects: one aggregation step by hand."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

from feddg.flare.constants import FedDGMeta
from feddg.flare.fedavg.aggregator import SampleSizeAggregator
from feddg.flare.uniform.aggregator import UniformAggregator

# Three sites with different data sizes N_k and small parameter arrays.
SITES = {
    "A": (10, [1.0, 2.0, -4.0], [3.0]),
    "B": (30, [4.0, 8.0, 2.0], [6.0]),
    "C": (20, [7.0, -1.0, 5.0], [0.0]),
}


def _result(site: str) -> FLModel:
    n, w, b = SITES[site]
    return FLModel(params={"w": np.array(w, np.float32), "b": np.array(b, np.float32)}, params_type=ParamsType.FULL,
                   meta={"client_name": site, FedDGMeta.NUM_TRAIN_SAMPLES: n}, current_round=0)


def _aggregate(agg, order) -> FLModel:
    agg.reset_stats()
    for site in order:
        agg.accept_model(_result(site))
    return agg.aggregate_model()


def test_the_result_is_the_plain_mean_not_the_data_size_weighted_one():
    out = _aggregate(UniformAggregator(), "ABC")
    # w = ((1 + 4 + 7) / 3, (2 + 8 - 1) / 3, (-4 + 2 + 5) / 3) = (4, 3, 1); b = (3 + 6 + 0) / 3 = 3
    np.testing.assert_allclose(out.params["w"], [4.0, 3.0, 1.0], rtol=1e-7)
    np.testing.assert_allclose(out.params["b"], [3.0], rtol=1e-7)
    assert out.params_type == ParamsType.FULL and out.meta == {"nr_aggregated": 3}
    # FedAvg on the same input: N = (10, 30, 20), b = (10 * 3 + 30 * 6 + 20 * 0) / 60 = 3.5
    fedavg = _aggregate(SampleSizeAggregator(), "ABC")
    np.testing.assert_allclose(fedavg.params["b"], [3.5], rtol=1e-7)
    assert not np.allclose(fedavg.params["w"], out.params["w"])


def test_the_order_of_arrival_does_not_change_the_bits():
    results = [_aggregate(UniformAggregator(), order) for order in itertools.permutations("ABC")]
    for out in results[1:]:
        for key in ("w", "b"):
            np.testing.assert_array_equal(out.params[key], results[0].params[key])


@pytest.mark.parametrize("n", [None, 0, float("nan")])
def test_the_sample_count_is_not_read(n):
    model = _result("A")
    model.meta[FedDGMeta.NUM_TRAIN_SAMPLES] = n
    agg = UniformAggregator()
    agg.accept_model(model)
    agg.accept_model(_result("B"))
    np.testing.assert_allclose(agg.aggregate_model().params["b"], [4.5])
