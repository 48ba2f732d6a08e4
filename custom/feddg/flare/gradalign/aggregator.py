"""Gradient alignment over weight differences as an NVFlare ModelAggregator; the math is in
:mod:`feddg.methods.gradalign`."""

from __future__ import annotations

import numpy as np
from nvflare.apis.event_type import EventType
from nvflare.apis.fl_context import FLContext
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
from nvflare.app_common.aggregators.model_aggregator import ModelAggregator
from nvflare.app_common.app_constant import AppConstants

from feddg.flare.gradalign.settings import GradAlignSettings
from feddg.flare.constants import CONFIG_FILE
from feddg.flare.job_config import load_job_config
from feddg.methods.gradalign import align

# Normalization running statistics are estimates of the data, not gradients (optional plain averaging).
NORM_STATS_SUFFIXES = (".running_mean", ".running_var")


class GradientAlignmentAggregator(ModelAggregator):
    """Aligns the sites' weight differences (Algorithm 1) and returns their mean as a weight difference.

    Over the wire each result is a WEIGHT_DIFF: the site's local model minus the global model it received; the
    aggregate is a WEIGHT_DIFF that the workflow adds to the global model. Floating-point parameters are aligned
    together (inner products over all of them flattened). Integer buffers (BatchNorm's ``num_batches_tracked``)
    and, when ``average_norm_stats`` is set, BatchNorm running means and variances are averaged plainly.
    Updates with NaN/Inf or mismatched parameters never reach this class (the workflow rejects them), so nothing
    from a rejected update is ever added to the global model; a single remaining site gives its own update.
    The aggregate's metadata says what the alignment did: ``gradalign_corrections``, the number of (i, j)
    corrections applied, and ``gradalign_corrected_sites``, the names of the sites whose update changed (the
    workflow copies both into the round's entry of the report's history).

    Args:
        config_file: the job's ``feddg.yaml``: lambda of Eq. (5) and the plain averaging of normalization running
            statistics (the ``gradalign`` section), and ``train.seed``, which with the round seeds the random order
            in which each site visits the others (so a run is reproducible).
    """

    def __init__(self, config_file: str = CONFIG_FILE):
        super().__init__()
        self.config_file = config_file
        self.settings = GradAlignSettings()
        self.seed = 0
        self._updates: dict[str, dict[str, np.ndarray]] = {}

    def handle_event(self, event_type: str, fl_ctx: FLContext):
        super().handle_event(event_type, fl_ctx)
        if event_type == EventType.START_RUN:
            cfg = load_job_config(fl_ctx, self.config_file)
            self.settings, self.seed = cfg.gradalign, cfg.train.seed

    def accept_model(self, model: FLModel) -> None:
        site = (model.meta or {}).get("client_name", "?")
        if model.params_type != ParamsType.DIFF:
            raise ValueError(f"site {site} sent {model.params_type}; gradient alignment needs weight differences")
        self._updates[site] = {k: np.asarray(v) for k, v in model.params.items()}

    def aligned_keys(self, reference: dict[str, np.ndarray]) -> list[str]:
        """Parameter names that are aligned; the rest are averaged plainly."""
        return [k for k, v in reference.items() if v.dtype.kind == "f"
                and not (self.settings.average_norm_stats and k.endswith(NORM_STATS_SUFFIXES))]

    def aggregate_model(self) -> FLModel:
        if not self._updates:
            raise RuntimeError("no accepted site updates to aggregate")
        sites = sorted(self._updates)
        updates = [self._updates[s] for s in sites]
        aligned = self.aligned_keys(updates[0])
        flat = np.stack([np.concatenate([u[k].ravel() for k in aligned]) for u in updates])
        r = self.fl_ctx.get_prop(AppConstants.CURRENT_ROUND, 0) if self.fl_ctx else 0
        rng = np.random.default_rng([self.seed, int(r or 0)])
        corrected, corrections = align(flat, self.settings.lam, rng=rng)
        changed = [s for s, row in zip(sites, np.any(corrected != flat, axis=1)) if row]
        self.info(f"round {r}: {len(changed)} of {len(sites)} site updates corrected for conflicts "
                  f"({corrections} corrections)")
        mean = corrected.mean(axis=0)
        result, offset = {}, 0
        for k in aligned:
            shape, size = updates[0][k].shape, updates[0][k].size
            result[k] = mean[offset : offset + size].reshape(shape).astype(updates[0][k].dtype)
            offset += size
        for k in updates[0]:
            if k not in result:
                result[k] = np.mean([u[k] for u in updates], axis=0)
        return FLModel(params=result, params_type=ParamsType.DIFF,
                       meta={"nr_aggregated": len(sites), "gradalign_corrections": corrections,
                             "gradalign_corrected_sites": changed})

    def reset_stats(self) -> None:
        self._updates = {}
