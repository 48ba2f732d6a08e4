"""Generalization Adjustment (GA), FedDG-GA (Zhang et al., CVPR 2023), section 3.3, Algorithm 1, Eq. (3).

Pure functions over site -> value mappings; no NVFlare, no torch.

Eq. (3), as printed in the paper::

    mu     = mean_i G_i                                  (over the sites with a valid gap this round)
    d^r    = (1 - r / R) * d                             (linear decay; d = 0.05 by default)
    a_i'   = a_i^{r-1} + d^r * (G_i - mu) / max_j (G_j - mu)
    a_i^r  = max(a_i', 0), renormalized to sum 1

G_i is the site's generalization gap: the loss of the received global model on a split of the site's data (the
one ``ga.gap_split`` names; the training split by default) minus the loss of the site's own model from the
previous round on the same split. A site with a larger gap is served worse by the global model and gains weight.

The authors' released code differs from the paper: it does not centre the gaps on their mean, scales the step by
a hard-coded 1/3, measures gaps with accuracy instead of the loss, and takes them on the validation split instead of
the training set. This module follows the paper (``ga.gap_split: val`` keeps the released code's split, see
docs/methods.md for the measurement behind the default).
"""

from __future__ import annotations

import math
from typing import Mapping


def step_size(round_index: int, total_rounds: int, d: float = 0.05) -> float:
    """d^r = (1 - r / R) * d, the linearly decaying step of round ``round_index`` (0-based) out of ``total_rounds``."""
    if total_rounds < 1:
        raise ValueError(f"total_rounds must be >= 1, got {total_rounds}")
    return max(0.0, 1.0 - round_index / total_rounds) * d


def is_valid_gap(gap: object) -> bool:
    return isinstance(gap, (int, float)) and not isinstance(gap, bool) and math.isfinite(gap)


def adjust_weights(weights: Mapping[str, float], gaps: Mapping[str, float], step: float) -> dict[str, float]:
    """One GA update of the weights of the sites present in a round.

    Args:
        weights: a_i^{r-1} of every site present this round.
        gaps: G_i for the sites among them whose gap is valid (finite); the others are not adjusted and are left
            out of mu.
        step: d^r.

    Returns:
        The new weights of the present sites, clipped at 0 and renormalized so that they keep the total mass they
        had (``sum(weights)``): over a full federation that is the paper's "sum to 1"; when some sites are absent,
        their stored weights stay exactly as they were for when they return.
        When no gap is valid or all valid gaps are equal, the weights are returned unchanged.
    """
    unknown = set(gaps) - set(weights)
    if unknown:
        raise ValueError(f"gaps for sites without a weight: {sorted(unknown)}")
    valid = {site: float(g) for site, g in gaps.items() if is_valid_gap(g)}
    mass = sum(weights.values())
    if not valid or mass <= 0:
        return dict(weights)
    mu = sum(valid.values()) / len(valid)
    spread = max(g - mu for g in valid.values())
    if spread <= 0:  # all gaps equal
        return dict(weights)
    moved = {site: a + step * (valid[site] - mu) / spread if site in valid else a for site, a in weights.items()}
    clipped = {site: max(a, 0.0) for site, a in moved.items()}
    total = sum(clipped.values())
    if total <= 0:
        return dict(weights)
    return {site: a * mass / total for site, a in clipped.items()}


def aggregation_weights(weights: Mapping[str, float], present: list[str]) -> dict[str, float]:
    """The weights used to average this round's models: the present sites' GA weights, renormalized to sum 1."""
    total = sum(weights[s] for s in present)
    if total <= 0:
        return {s: 1.0 / len(present) for s in present}
    return {s: weights[s] / total for s in present}
