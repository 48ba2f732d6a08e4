"""The weighted average of the sites' models that FedAvg-style aggregators share: summed in site-name order.

The sum runs in site-name order once every result is in, not in order of arrival: floating-point addition is not
associative, and the sites of a round arrive in a different order in every run. Summed as they came, two runs of
one job with one seed differed in the last bits of the round-0 model, which training amplified into held-out Dice
differences of up to 0.12 after 20 rounds (see docs/benchmark.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.app_common.aggregators.model_aggregator import ModelAggregator
from nvflare.app_common.aggregators.weighted_aggregation_helper import WeightedAggregationHelper


def weighted_mean(updates: Mapping[str, FLModel], weights: Mapping[str, float]) -> dict[str, Any]:
    """sum_k w_k theta_k / sum_k w_k over the sites of ``updates`` (site -> result), added in site-name order."""
    helper = WeightedAggregationHelper()
    for site in sorted(updates):
        helper.add(data=updates[site].params, weight=weights[site], contributor_name=site,
                   contribution_round=updates[site].current_round)
    return helper.get_result()


class SiteWeightedAggregator(ModelAggregator):
    """Averages the models of the sites present in a round with a weight per site that :meth:`site_weight` reads
    from the site's own result; a subclass says what the weight is (FedAvg: N_k, the uniform control: 1).

    The aggregate has the params type of the results (they all share it: the workflow sends one task) and, in its
    metadata, ``nr_aggregated``.
    """

    def __init__(self):
        super().__init__()
        self._updates: dict[str, FLModel] = {}
        self._weights: dict[str, float] = {}

    def site_weight(self, site: str, model: FLModel) -> float:
        """The weight of ``site``'s result ``model`` in the average; ValueError naming the site refuses the result."""
        raise NotImplementedError

    def accept_model(self, model: FLModel) -> None:
        site = (model.meta or {}).get("client_name", "?")
        weight = self.site_weight(site, model)
        self._updates[site], self._weights[site] = model, weight

    def aggregate_model(self) -> FLModel:
        if not self._updates:
            raise RuntimeError("no accepted site updates to aggregate")
        first = self._updates[min(self._updates)]
        return FLModel(params=weighted_mean(self._updates, self._weights), params_type=first.params_type,
                       meta={"nr_aggregated": len(self._updates)})

    def reset_stats(self) -> None:
        self._updates, self._weights = {}, {}
