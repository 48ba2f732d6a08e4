"""Gradient alignment over weight differences as an NVFlare ModelAggregator; the math is in
:mod:`feddg.methods.gradalign`."""

from __future__ import annotations

import numpy as np
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
from nvflare.app_common.aggregators.model_aggregator import ModelAggregator
from nvflare.app_common.app_constant import AppConstants

from feddg.methods.gradalign import align_updates

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

    Args:
        lam: lambda of Eq. (5); the paper's 0.1.
        seed: seeds the random order in which each site visits the others (with the round, so a run is
            reproducible).
        average_norm_stats: average normalization running statistics plainly instead of aligning them.
    """

    def __init__(self, lam: float = 0.1, seed: int = 0, average_norm_stats: bool = True):
        super().__init__()
        if not 0.0 < lam <= 0.5:
            raise ValueError(f"lam must be in (0, 0.5], got {lam}")
        self.lam = lam
        self.seed = seed
        self.average_norm_stats = average_norm_stats
        self._updates: dict[str, dict[str, np.ndarray]] = {}

    def accept_model(self, model: FLModel) -> None:
        site = (model.meta or {}).get("client_name", "?")
        if model.params_type != ParamsType.DIFF:
            raise ValueError(f"site {site} sent {model.params_type}; gradient alignment needs weight differences")
        self._updates[site] = {k: np.asarray(v) for k, v in model.params.items()}

    def aligned_keys(self, reference: dict[str, np.ndarray]) -> list[str]:
        """Parameter names that are aligned; the rest are averaged plainly."""
        return [k for k, v in reference.items() if v.dtype.kind == "f"
                and not (self.average_norm_stats and k.endswith(NORM_STATS_SUFFIXES))]

    def aggregate_model(self) -> FLModel:
        if not self._updates:
            raise RuntimeError("no accepted site updates to aggregate")
        sites = sorted(self._updates)
        updates = [self._updates[s] for s in sites]
        aligned = self.aligned_keys(updates[0])
        flat = np.stack([np.concatenate([u[k].ravel() for k in aligned]) for u in updates])
        r = self.fl_ctx.get_prop(AppConstants.CURRENT_ROUND, 0) if self.fl_ctx else 0
        rng = np.random.default_rng([self.seed, int(r or 0)])
        corrected = align_updates(flat, self.lam, rng=rng)
        changed = int(np.any(corrected != flat, axis=1).sum())
        self.info(f"round {r}: {changed} of {len(sites)} site updates corrected for conflicts")
        mean = corrected.mean(axis=0)
        result, offset = {}, 0
        for k in aligned:
            shape, size = updates[0][k].shape, updates[0][k].size
            result[k] = mean[offset : offset + size].reshape(shape).astype(updates[0][k].dtype)
            offset += size
        for k in updates[0]:
            if k not in result:
                result[k] = np.mean([u[k] for u in updates], axis=0)
        return FLModel(params=result, params_type=ParamsType.DIFF, meta={"nr_aggregated": len(sites)})

    def reset_stats(self) -> None:
        self._updates = {}
