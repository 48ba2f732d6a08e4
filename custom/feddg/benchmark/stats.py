"""Paired bootstrap statistics for comparing a segmentation method with a baseline (FedAvg).

In a leave-one-site-out benchmark every held-out site yields one score (Dice) per case for every method, with the
cases in the same order for every method. A comparison is therefore *paired*: what matters is the per-case
difference ``method - baseline``, not the two score distributions separately. This module computes

* :func:`paired_difference`: the mean per-case difference on one site, with a bootstrap confidence interval
  (``scipy.stats.bootstrap`` with ``paired=True``: whole cases are resampled, both scores of a case together);
* :func:`stratified_difference`: the unweighted mean over sites of each site's mean difference -- the papers'
  "average" column is a plain mean over the held-out sites -- with a bootstrap stratified by site (cases are
  resampled within each site, independently, so every resample keeps each site's case count);
* :func:`holm`: Holm-Bonferroni adjusted p-values, for several comparisons made at once;
* :class:`Difference`: the result, printable (``+0.052 [+0.011, +0.093]*``) and JSON-ready (:meth:`Difference.to_dict`).

The case is the unit of resampling: a volume for NIfTI data, an image for PNG data. Training seeds are *not* a
resampling unit here: the caller pools them first, averaging each case's score over the seeds, and passes one score
per case. Intervals are BCa (bias-corrected and accelerated) where scipy can compute them and percentile intervals
where BCa fails or gives NaN; when every difference is the same, no bootstrap is run at all (see
:func:`paired_difference`). The p-value read off the bootstrap distribution is approximate; it is meant for ordering
comparisons and for Holm's correction, not as an exact test.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

import numpy as np
from scipy import stats

__all__ = ["Difference", "holm", "mean_interval", "paired_difference", "stratified_difference"]

Scores = Union[Sequence[float], np.ndarray]

# Differences whose spread is below this (relative to their size, at least 1) count as identical: a - b can differ in
# the last bit between cases that "should" have the same difference, and the bootstrap of such data is a point mass.
_DEGENERATE_RTOL = 1e-12

# scipy >= 1.15 takes `rng`; older releases (the project allows scipy >= 1.10) only `random_state`.
_RNG_KEYWORD = "rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state"


@dataclass(frozen=True)
class Difference:
    """A mean difference (method - baseline) with its bootstrap confidence interval.

    ``mean``: the observed statistic; ``low``/``high``: the confidence interval; ``p_value``: the approximate
    two-sided bootstrap p-value (see :func:`paired_difference`); ``n_cases``: the number of cases used (over all
    sites); ``confidence``: the interval's level, e.g. 0.95; ``method``: how the interval was computed, ``'BCa'``,
    ``'percentile'`` (BCa failed or gave NaN) or ``'degenerate'`` (every difference identical: ``[mean, mean]``).
    """

    mean: float
    low: float
    high: float
    p_value: float
    n_cases: int
    confidence: float
    method: str

    @property
    def excludes_zero(self) -> bool:
        """Whether the interval lies entirely above or entirely below zero."""
        return self.low > 0 or self.high < 0

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain Python floats, ints and strings, ready for ``json.dump``."""
        return {
            "mean": float(self.mean),
            "low": float(self.low),
            "high": float(self.high),
            "p_value": float(self.p_value),
            "n_cases": int(self.n_cases),
            "confidence": float(self.confidence),
            "method": str(self.method),
        }

    def format(self, digits: int = 3) -> str:
        """E.g. ``"+0.052 [+0.011, +0.093]*"``; the trailing ``*`` marks an interval that excludes zero."""
        text = f"{self.mean:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"
        return text + ("*" if self.excludes_zero else "")


def paired_difference(method: Scores, baseline: Scores, *, confidence: float = 0.95, n_resamples: int = 9999,
                      seed: int = 0) -> Difference:
    """Mean per-case difference ``method - baseline`` on one site, with a paired bootstrap interval.

    ``method`` and ``baseline``: shape ``(n_cases,)``, one score per case, the cases in the same order in both
    (``n_cases >= 2``, finite numbers). The interval comes from ``scipy.stats.bootstrap(paired=True)`` with the
    statistic ``mean(a) - mean(b)`` and ``rng=np.random.default_rng(seed)``: method ``'BCa'``, falling back to
    ``'percentile'`` (with the same resamples) when BCa raises or gives NaN; the returned ``method`` field says which.

    The p-value is two-sided and read off the bootstrap distribution ``T*`` of the statistic:
    ``p = min(1, 2 * min(share(T* <= 0), share(T* >= 0)))``, floored at ``1 / (n_resamples + 1)``. It is the
    smallest ``1 - confidence`` at which a percentile interval would touch zero -- an approximate p-value, good for
    ordering comparisons and for :func:`holm`, not an exact test.

    When every difference is identical (zero variance) the bootstrap distribution is a point mass, and scipy warns
    or fails on it; then scipy is not called: the interval is ``[d, d]``, ``method`` is ``'degenerate'`` and the
    p-value is 1.0 if ``d == 0``, else ``1 / (n_resamples + 1)``.
    """
    _check_options(confidence, n_resamples)
    a = _as_scores(method, "method scores")
    b = _as_scores(baseline, "baseline scores")
    if a.shape != b.shape:
        raise ValueError(f"method and baseline scores have different lengths ({a.size} vs {b.size}); "
                         "they must hold the same cases in the same order")
    _check_cases(a.size, "the scores")
    diffs = a - b
    mean = float(np.mean(diffs))  # = mean(a) - mean(b); computed as stratified_difference does, to the last bit
    if _is_constant(diffs):
        return _degenerate(mean, a.size, confidence, n_resamples)
    return _bootstrap((a, b), _mean_difference, paired=True, mean=mean, n_cases=a.size, confidence=confidence,
                      n_resamples=n_resamples, seed=seed)


def stratified_difference(per_site: Mapping[str, tuple[Scores, Scores]], *, confidence: float = 0.95,
                          n_resamples: int = 9999, seed: int = 0) -> Difference:
    """The unweighted mean over sites of each site's mean paired difference, with a site-stratified bootstrap.

    ``per_site``: site name -> ``(method scores, baseline scores)``, each of shape ``(n_cases_site,)`` and paired
    within the site (at least one site, at least 2 cases per site, finite numbers). The statistic is
    ``mean over sites of mean(method - baseline)``: every site counts once, whatever its case count, as in the
    papers' "average" column over held-out sites.

    The bootstrap resamples cases within each site independently: ``scipy.stats.bootstrap`` gets one sample per
    site, that site's per-case differences, with ``paired=False`` -- scipy resamples each sample on its own, which
    is exactly stratification. Interval method, fallback, p-value and the degenerate case are as in
    :func:`paired_difference` (degenerate here: every site's differences are constant, so every resample gives the
    same statistic). With one site the result equals :func:`paired_difference` on that site up to bootstrap noise.
    """
    _check_options(confidence, n_resamples)
    if not per_site:
        raise ValueError("per_site is empty: need at least one site with (method scores, baseline scores)")
    site_diffs = []
    for site, pair in per_site.items():
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(f"site {site!r}: expected a pair (method scores, baseline scores)")
        a = _as_scores(pair[0], f"site {site!r}: method scores")
        b = _as_scores(pair[1], f"site {site!r}: baseline scores")
        if a.shape != b.shape:
            raise ValueError(f"site {site!r}: method and baseline scores have different lengths "
                             f"({a.size} vs {b.size}); they must hold the same cases in the same order")
        _check_cases(a.size, f"site {site!r}")
        site_diffs.append(a - b)
    samples = tuple(site_diffs)
    n_cases = sum(d.size for d in samples)
    mean = float(_mean_of_site_means(*samples, axis=-1))
    if all(_is_constant(d) for d in samples):
        return _degenerate(mean, n_cases, confidence, n_resamples)
    return _bootstrap(samples, _mean_of_site_means, paired=False, mean=mean, n_cases=n_cases, confidence=confidence,
                      n_resamples=n_resamples, seed=seed)


def holm(pvalues: Mapping[str, float]) -> dict[str, float]:
    """Holm-Bonferroni adjusted p-values (step-down), same keys as ``pvalues``.

    With the ``m`` p-values sorted ascending, ``p_(1) <= ... <= p_(m)``, the adjusted value of the ``i``-th is
    ``min(1, max_{j <= i} (m - j + 1) * p_(j))``: monotone in the raw p-values and capped at 1. Rejecting where
    the adjusted value is ``<= alpha`` controls the family-wise error rate at ``alpha``.
    """
    # Written here: scipy.stats.false_discovery_control is Benjamini-Hochberg / Benjamini-Yekutieli (false
    # discovery rate), not Holm (family-wise error rate), and scipy has no Holm correction.
    for key, p in pvalues.items():
        if not (isinstance(p, (int, float, np.floating, np.integer)) and 0.0 <= float(p) <= 1.0):
            raise ValueError(f"p-value of {key!r} must be a number in [0, 1], got {p!r}")
    ordered = sorted(pvalues.items(), key=lambda item: float(item[1]))
    m = len(ordered)
    adjusted: dict[str, float] = {}
    running = 0.0
    for rank, (key, p) in enumerate(ordered):
        running = max(running, min(1.0, (m - rank) * float(p)))
        adjusted[key] = running
    return {key: adjusted[key] for key in pvalues}


# -- internals ---------------------------------------------------------------------------------------------------


def _mean_difference(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    """``mean(a) - mean(b)`` along ``axis`` (vectorized for scipy: leading axes are resamples)."""
    return np.mean(a, axis=axis) - np.mean(b, axis=axis)


def _mean_of_site_means(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
    """Unweighted mean over samples (sites) of each sample's mean along ``axis``; leading axes broadcast."""
    return sum(np.mean(s, axis=axis) for s in samples) / len(samples)


def _bootstrap(data: tuple[np.ndarray, ...], statistic: Callable[..., np.ndarray], *, paired: bool, mean: float,
               n_cases: int, confidence: float, n_resamples: int, seed: int) -> Difference:
    """BCa interval, else percentile with the same seed (same resamples: the jackknife draws no random numbers)."""
    result, used = None, "BCa"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", stats.DegenerateDataWarning)
            result = _run_bootstrap(data, statistic, paired, confidence, n_resamples, seed, "BCa")
    except (ValueError, FloatingPointError, ZeroDivisionError):
        result = None
    if result is None or not (np.isfinite(result.confidence_interval.low)
                              and np.isfinite(result.confidence_interval.high)):
        used = "percentile"
        result = _run_bootstrap(data, statistic, paired, confidence, n_resamples, seed, "percentile")
    distribution = np.asarray(result.bootstrap_distribution, dtype=float).reshape(-1)
    return Difference(mean=mean, low=float(result.confidence_interval.low), high=float(result.confidence_interval.high),
                      p_value=_bootstrap_p_value(distribution, n_resamples), n_cases=int(n_cases),
                      confidence=float(confidence), method=used)


def _run_bootstrap(data: tuple[np.ndarray, ...], statistic: Callable[..., np.ndarray], paired: bool,
                   confidence: float, n_resamples: int, seed: int, method: str) -> Any:
    options = {_RNG_KEYWORD: np.random.default_rng(seed)}
    return stats.bootstrap(data, statistic, n_resamples=n_resamples, vectorized=True, paired=paired, axis=-1,
                           confidence_level=confidence, method=method, **options)


def _bootstrap_p_value(distribution: np.ndarray, n_resamples: int) -> float:
    """``min(1, 2 * min(share <= 0, share >= 0))``, floored at ``1 / (n_resamples + 1)``."""
    below = float(np.mean(distribution <= 0))
    above = float(np.mean(distribution >= 0))
    return max(min(1.0, 2.0 * min(below, above)), 1.0 / (n_resamples + 1))


def _degenerate(mean: float, n_cases: int, confidence: float, n_resamples: int) -> Difference:
    p = 1.0 if mean == 0 else 1.0 / (n_resamples + 1)
    return Difference(mean=mean, low=mean, high=mean, p_value=p, n_cases=int(n_cases), confidence=float(confidence),
                      method="degenerate")


def _is_constant(values: np.ndarray) -> bool:
    scale = max(1.0, float(np.max(np.abs(values))))
    return float(np.ptp(values)) <= _DEGENERATE_RTOL * scale


def _as_scores(values: Scores, what: str) -> np.ndarray:
    try:
        array = np.asarray(values, dtype=float)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{what} must be numbers: {error}") from None
    if array.ndim != 1:
        raise ValueError(f"{what} must be one-dimensional (one score per case), got shape {array.shape}")
    bad = np.flatnonzero(~np.isfinite(array))
    if bad.size:
        raise ValueError(f"{what} contain non-finite values (NaN or inf) at case index(es) {bad.tolist()[:10]}")
    return array


def _check_cases(n: int, what: str) -> None:
    if n < 2:
        raise ValueError(f"{what}: need at least 2 cases (pairs) for a bootstrap, got {n}")


def _check_options(confidence: float, n_resamples: int) -> None:
    if not (isinstance(confidence, (int, float)) and 0.0 < float(confidence) < 1.0):
        raise ValueError(f"confidence must be strictly between 0 and 1, got {confidence!r}")
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)) or n_resamples < 1:
        raise ValueError(f"n_resamples must be a positive integer, got {n_resamples!r}")


def mean_interval(scores: Scores, *, confidence: float = 0.95, n_resamples: int = 9999, seed: int = 0
                  ) -> tuple[float, float, float]:
    """(mean, low, high): the mean of one method's per-case scores with a percentile bootstrap interval (the bars
    of a chart; comparisons between methods use the paired functions above). A constant sample gives [mean, mean].
    """
    values = _as_scores(scores, "scores")
    _check_cases(len(values), "scores")
    _check_options(confidence, n_resamples)
    mean = float(np.mean(values))
    if _is_constant(values):
        return mean, mean, mean
    res = stats.bootstrap((values,), np.mean, confidence_level=confidence, n_resamples=n_resamples,
                          method="percentile", vectorized=True, axis=-1,
                          **{_RNG_KEYWORD: np.random.default_rng(seed)})
    return mean, float(res.confidence_interval.low), float(res.confidence_interval.high)
