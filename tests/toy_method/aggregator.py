"""The coordinate-wise median of the sites' models as an NVFlare ModelAggregator, after trimming the updates that
moved furthest (by the norm each site's hook sends)."""

from __future__ import annotations

import json
import os

import numpy as np
from nvflare.apis.event_type import EventType
from nvflare.apis.fl_context import FLContext
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
from nvflare.app_common.aggregators.model_aggregator import ModelAggregator
from nvflare.app_common.app_constant import AppConstants

from feddg.flare.constants import CONFIG_FILE
from feddg.flare.job_config import config_path, load_job_config
from feddg.jsonfile import write_json
from tests.toy_method.part import HISTORY, UPDATE_NORM


class MedianAggregator(ModelAggregator):
    """Each parameter of the global model is the median of the kept sites' values (integer buffers included; the
    workflow casts them back to the global model's dtype). Each round's norms and dropped sites go to
    ``history_file`` in the server's run folder; ``resume_from`` continues an earlier run's history.

    Args:
        config_file: the job's ``feddg.yaml`` (``median.trim``).
        history_file: the history's name in the server's run folder.
        resume_from: a previous run's history (relative: in the app's config folder).
    """

    def __init__(self, config_file: str = CONFIG_FILE, history_file: str = HISTORY.name,
                 resume_from: str | None = None):
        super().__init__()
        self.config_file, self.history_file, self.resume_from = config_file, history_file, resume_from
        self._models: dict[str, dict[str, np.ndarray]] = {}
        self._norms: dict[str, float] = {}
        self._trim = 0
        self._history: list[dict] = []
        self._path: str | None = None

    def handle_event(self, event_type: str, fl_ctx: FLContext):
        super().handle_event(event_type, fl_ctx)
        if event_type == EventType.START_RUN:
            self._trim = load_job_config(fl_ctx, self.config_file).median.trim
            run_dir = fl_ctx.get_engine().get_workspace().get_run_dir(fl_ctx.get_job_id())
            self._path = os.path.join(run_dir, self.history_file)
            if self.resume_from:
                with open(config_path(fl_ctx, self.resume_from)) as f:
                    self._history = list(json.load(f)["history"])

    def accept_model(self, model: FLModel) -> None:
        site = (model.meta or {}).get("client_name", "?")
        if model.params_type != ParamsType.FULL:
            raise ValueError(f"site {site} sent {model.params_type}; the median needs the sites' full weights")
        self._models[site] = {k: np.asarray(v) for k, v in model.params.items()}
        self._norms[site] = float((model.meta or {}).get(UPDATE_NORM, 0.0))

    def aggregate_model(self) -> FLModel:
        if not self._models:
            raise RuntimeError("no accepted site models to aggregate")
        by_norm = sorted(self._models, key=lambda s: (-self._norms[s], s))
        dropped = by_norm[:min(self._trim, len(by_norm) - 1)]
        sites = sorted(set(self._models) - set(dropped))
        first = self._models[sites[0]]
        params = {k: np.median(np.stack([self._models[s][k] for s in sites]), axis=0) for k in first}
        self.info(f"median of the models of {len(sites)} sites: {sites}")
        round_index = int(self.fl_ctx.get_prop(AppConstants.CURRENT_ROUND) or 0) if self.fl_ctx else len(self._history)
        self._history.append({"round": round_index, "norms": dict(self._norms), "dropped": dropped})
        if self._path:
            write_json(self._path, {"history": self._history}, indent=2)
        return FLModel(params=params, params_type=ParamsType.FULL, meta={"nr_aggregated": len(sites)})

    def reset_stats(self) -> None:
        self._models, self._norms = {}, {}
