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

    The sum runs in site-name order once every result is in, not in order of arrival: floating-point addition is
    not associative, and the sites of a round arrive in a different order in every run. Summed as they came, two
    runs of one job with one seed differed in the last bits of the round-0 model, which training amplified into
    held-out Dice differences of up to 0.12 after 20 rounds (see the README's benchmark section).
    """

    def __init__(self):
        super().__init__()
        self._updates: dict[str, tuple[FLModel, float]] = {}

    def accept_model(self, model: FLModel) -> None:
        site = (model.meta or {}).get("client_name", "?")
        n = (model.meta or {}).get(FedDGMeta.NUM_TRAIN_SAMPLES)
        if not isinstance(n, (int, float)) or isinstance(n, bool) or not math.isfinite(n) or n <= 0:
            raise ValueError(f"site {site}: metadata {FedDGMeta.NUM_TRAIN_SAMPLES!r} must be a positive number, got {n!r}")
        self._updates[site] = (model, float(n))

    def aggregate_model(self) -> FLModel:
        if not self._updates:
            raise RuntimeError("no accepted site updates to aggregate")
        helper = WeightedAggregationHelper()
        for site in sorted(self._updates):
            model, n = self._updates[site]
            helper.add(data=model.params, weight=n, contributor_name=site, contribution_round=model.current_round)
        first = self._updates[min(self._updates)][0]
        return FLModel(params=helper.get_result(), params_type=first.params_type,
                       meta={"nr_aggregated": len(self._updates)})

    def reset_stats(self) -> None:
        self._updates = {}
