"""Generalization Adjustment (FedDG-GA) as an NVFlare ModelAggregator; the math is in :mod:`feddg.methods.ga`."""

from __future__ import annotations

import json
import os
from typing import Any

from nvflare.apis.analytix import AnalyticsDataType
from nvflare.apis.event_type import EventType
from nvflare.apis.fl_context import FLContext
from nvflare.apis.utils.analytix_utils import create_analytic_dxo, send_analytic_dxo
from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.app_common.aggregators.model_aggregator import ModelAggregator
from nvflare.app_common.app_constant import AppConstants

from feddg.flare.constants import CONFIG_FILE
from feddg.flare.ga.part import GENERALIZATION_GAP, HISTORY
from feddg.flare.job_config import config_path, load_job_config
from feddg.flare.weighted_average import weighted_mean
from feddg.jsonfile import write_json
from feddg.methods.ga import adjust_weights, aggregation_weights, is_valid_gap, step_size


class GeneralizationAdjustmentAggregator(ModelAggregator):
    """Averages the training sites' models with GA weights instead of data-size weights.

    Over the wire each result carries the site's trained weights and, from round 1 on, its generalization gap
    ``generalization_gap`` in the metadata (GA's site hook, :mod:`feddg.flare.ga.hook`). Weights start
    uniform (a_i = 1/M over the training sites of ``feddg.yaml``), not proportional to data size.

    A site whose gap is missing, NaN or infinite is not moved this round and is left out of mu (one warning naming
    it): it keeps its previous weight unless another site's weight is clipped at 0, in which case the renormalization
    rescales it with the rest. A site absent from a round keeps its stored weight for when it returns; the present
    sites' weights are renormalized for the average. Updates with NaN/Inf or mismatched parameters never reach
    this class: the workflow rejects them first.

    The aggregate carries, in its metadata, the round's averaging weights (``ga_weights``), the valid gaps
    (``ga_gaps``: site -> G_i, empty in round 0) and the step d^r (``ga_step``); the workflow copies them into the
    round's entry of the report's history. The weights of every round also go to TensorBoard
    (``ga_weight/<site>``) and to a JSON history in the server's run folder. A job that resumes from a checkpoint
    (a new job with a later start round) continues the weights from the previous run's history with
    ``resume_from``.

    Args:
        config_file: the job's ``feddg.yaml``: training sites, R = ``train.rounds`` (the total rounds of the
            whole training, also when a resumed job runs only the rounds left) and d = ``ga.step_size``.
        history_file: name of the JSON history in the server's run folder.
        resume_from: path of a previous run's history file to continue from.
    """

    def __init__(
        self,
        config_file: str = CONFIG_FILE,
        history_file: str = HISTORY.name,
        resume_from: str | None = None,
    ):
        super().__init__()
        self.config_file = config_file
        self._step_size = 0.0
        self.history_file = history_file
        self.resume_from = resume_from
        self._weights: dict[str, float] = {}
        self._history: list[dict[str, Any]] = []
        self._total_rounds = 1
        self._updates: dict[str, FLModel] = {}
        self._history_path: str | None = None

    def handle_event(self, event_type: str, fl_ctx: FLContext):
        super().handle_event(event_type, fl_ctx)
        if event_type == EventType.START_RUN:
            cfg = load_job_config(fl_ctx, self.config_file)
            sites = cfg.data.train_sites
            self._total_rounds = cfg.train.rounds
            self._step_size = cfg.ga.step_size
            self._weights = {site: 1.0 / len(sites) for site in sites}
            run_dir = fl_ctx.get_engine().get_workspace().get_run_dir(fl_ctx.get_job_id())
            self._history_path = os.path.join(run_dir, self.history_file)
            if self.resume_from:  # relative: in the app's config folder (where `feddg resume-job` puts it)
                self._resume(config_path(fl_ctx, self.resume_from))

    def _resume(self, path: str) -> None:
        with open(path) as f:
            saved = json.load(f)
        weights = saved.get("weights", {})
        if set(weights) != set(self._weights):
            raise ValueError(f"{path}: GA weights are for sites {sorted(weights)}, this job trains {sorted(self._weights)}")
        self._weights = {site: float(w) for site, w in weights.items()}
        self._history = list(saved.get("history", []))
        self.info(f"GA weights resumed from {path} after round {self._history[-1]['round'] if self._history else '-'}")

    # ------------------------------------------------------------------ ModelAggregator
    def accept_model(self, model: FLModel) -> None:
        site = (model.meta or {}).get("client_name", "?")
        if site not in self._weights:
            raise ValueError(f"site {site} is not a training site of this job {sorted(self._weights)}")
        self._updates[site] = model

    def aggregate_model(self) -> FLModel:
        if not self._updates:
            raise RuntimeError("no accepted site updates to aggregate")
        present = sorted(self._updates)
        round_index = self._round()
        gaps: dict[str, float] = {}
        for site in present:
            gap = (self._updates[site].meta or {}).get(GENERALIZATION_GAP)
            if is_valid_gap(gap):
                gaps[site] = float(gap)
            elif round_index > 0:  # round 0 carries no gaps by design
                self.warning(f"round {round_index}: site {site} sent no valid generalization gap ({gap!r}); "
                             f"it keeps its previous weight this round")
        step = step_size(round_index, self._total_rounds, self._step_size)
        self._weights.update(adjust_weights({s: self._weights[s] for s in present}, gaps, step))
        used = aggregation_weights(self._weights, present)

        params_type = self._updates[present[0]].params_type
        self._record(round_index, step, gaps, used)
        return FLModel(params=weighted_mean(self._updates, used), params_type=params_type,
                       meta={"nr_aggregated": len(present), "ga_weights": used, "ga_gaps": dict(gaps),
                             "ga_step": step})

    def reset_stats(self) -> None:
        self._updates = {}

    # ------------------------------------------------------------------ history
    def _round(self) -> int:
        r = self.fl_ctx.get_prop(AppConstants.CURRENT_ROUND) if self.fl_ctx else None
        if r is None:
            r = next(iter(self._updates.values())).current_round
        return int(r or 0)

    def _record(self, round_index: int, step: float, gaps: dict[str, float], used: dict[str, float]) -> None:
        self._history.append({"round": round_index, "step": step, "gaps": gaps, "weights": dict(self._weights),
                              "aggregation_weights": used})
        self.info(f"round {round_index}: GA weights {({s: round(w, 4) for s, w in used.items()})}, step {step:.4f}")
        if self._history_path:
            write_json(self._history_path, {"weights": self._weights, "history": self._history}, indent=2)
        if self.fl_ctx:
            for site, w in self._weights.items():
                dxo = create_analytic_dxo(tag=f"ga_weight/{site}", value=w, data_type=AnalyticsDataType.SCALAR,
                                          global_step=round_index)
                send_analytic_dxo(self, dxo=dxo, fl_ctx=self.fl_ctx)
