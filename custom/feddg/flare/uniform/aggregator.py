"""The sites' models averaged with equal weights as an NVFlare ModelAggregator."""

from __future__ import annotations

from nvflare.app_common.abstract.fl_model import FLModel

from feddg.flare.weighted_average import SiteWeightedAggregator


class UniformAggregator(SiteWeightedAggregator):
    """Averages the models of the K sites present in a round with weight 1/K each, whatever their data size.

    Over the wire each result carries the site's trained weights (or weight differences); the sites' executor
    also sends ``num_train_samples`` as for every method, but this aggregator does not read it and so does not
    validate it: a weight of 1 per site needs nothing from the site but its model, and refusing an update for
    metadata the average does not use would change which sites count. The aggregate carries the same params type
    and ``nr_aggregated``. The sum runs in site-name order, as FedAvg's (:mod:`feddg.flare.weighted_average`).
    """

    def site_weight(self, site: str, model: FLModel) -> float:
        """1 for every site."""
        return 1.0
