"""FedAvg weighted by training-set size, theta = sum_k (N_k / N) theta_k (ELCFS section 3.1)."""

from __future__ import annotations

import math

from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.app_common.aggregators.model_aggregator import ModelAggregator
from nvflare.app_common.aggregators.weighted_aggregation_helper import WeightedAggregationHelper

from feddg.flare.constants import FedDGMeta


class SampleSizeAggregator(ModelAggregator):
    """Averages the sites' models with weights N_k / N.

    Over the wire each result carries the site's weights (or weight differences) and, in its metadata,
    ``num_train_samples`` = N_k. NVFlare's own FedAvg multiplies a per-client weight by the reported step count;
    here the step count is ignored, so the data size is counted exactly once.
    """

    def __init__(self):
        super().__init__()
        self._helper = WeightedAggregationHelper()
        self._params_type = None
        self._count = 0

    def accept_model(self, model: FLModel) -> None:
        site = (model.meta or {}).get("client_name", "?")
        n = (model.meta or {}).get(FedDGMeta.NUM_TRAIN_SAMPLES)
        if not isinstance(n, (int, float)) or isinstance(n, bool) or not math.isfinite(n) or n <= 0:
            raise ValueError(f"site {site}: metadata {FedDGMeta.NUM_TRAIN_SAMPLES!r} must be a positive number, got {n!r}")
        self._helper.add(data=model.params, weight=float(n), contributor_name=site, contribution_round=model.current_round)
        self._params_type = model.params_type
        self._count += 1

    def aggregate_model(self) -> FLModel:
        if not self._count:
            raise RuntimeError("no accepted site updates to aggregate")
        return FLModel(params=self._helper.get_result(), params_type=self._params_type,
                       meta={"nr_aggregated": self._count})

    def reset_stats(self) -> None:
        self._helper.reset_stats()
        self._params_type = None
        self._count = 0
