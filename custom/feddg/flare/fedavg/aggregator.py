"""FedAvg weighted by training-set size, theta = sum_k (N_k / N) theta_k (ELCFS section 3.1)."""

from __future__ import annotations

import math

from nvflare.app_common.abstract.fl_model import FLModel

from feddg.flare.constants import FedDGMeta
from feddg.flare.weighted_average import SiteWeightedAggregator


class SampleSizeAggregator(SiteWeightedAggregator):
    """Averages the sites' models with weights N_k / N.

    Over the wire each result carries the site's weights (or weight differences) and, in its metadata,
    ``num_train_samples`` = N_k. NVFlare's own FedAvg multiplies a per-client weight by the reported step count;
    here the step count is ignored, so the data size is counted exactly once. The sum runs in site-name order
    (:mod:`feddg.flare.weighted_average` says why).
    """

    def site_weight(self, site: str, model: FLModel) -> float:
        """N_k; ValueError naming the site when ``num_train_samples`` is missing or not a positive number."""
        n = (model.meta or {}).get(FedDGMeta.NUM_TRAIN_SAMPLES)
        if not isinstance(n, (int, float)) or isinstance(n, bool) or not math.isfinite(n) or n <= 0:
            raise ValueError(f"site {site}: metadata {FedDGMeta.NUM_TRAIN_SAMPLES!r} must be a positive number, got {n!r}")
        return float(n)
