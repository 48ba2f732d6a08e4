"""The coordinate-wise median of the sites' models as an NVFlare ModelAggregator."""

from __future__ import annotations

import numpy as np
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
from nvflare.app_common.aggregators.model_aggregator import ModelAggregator


class MedianAggregator(ModelAggregator):
    """Each parameter of the global model is the median of the sites' values (integer buffers included; the
    workflow casts them back to the global model's dtype)."""

    def __init__(self):
        super().__init__()
        self._models: dict[str, dict[str, np.ndarray]] = {}

    def accept_model(self, model: FLModel) -> None:
        site = (model.meta or {}).get("client_name", "?")
        if model.params_type != ParamsType.FULL:
            raise ValueError(f"site {site} sent {model.params_type}; the median needs the sites' full weights")
        self._models[site] = {k: np.asarray(v) for k, v in model.params.items()}

    def aggregate_model(self) -> FLModel:
        if not self._models:
            raise RuntimeError("no accepted site models to aggregate")
        sites = sorted(self._models)
        first = self._models[sites[0]]
        params = {k: np.median(np.stack([self._models[s][k] for s in sites]), axis=0) for k in first}
        self.info(f"median of the models of {len(sites)} sites: {sites}")
        return FLModel(params=params, params_type=ParamsType.FULL, meta={"nr_aggregated": len(sites)})

    def reset_stats(self) -> None:
        self._models = {}
