"""Statistics for comparing a FedDG method with a baseline, with the training seed as the unit of inference.

A leave-one-site-out cell (method, held-out site) is trained with several seeds. Seed ``k`` of every method starts
from the same initial weights, reads the data in the same order and draws the same augmentation, so seed ``k`` of a
method and seed ``k`` of the baseline form a pair. One trained model is summarised by the mean Dice over the
held-out site's test cases; the comparison at site ``s`` is built on the paired seed differences::

    d[s, k] = mean_i x_method[s, k, i] - mean_i x_baseline[s, k, i]      (i: the site's test cases)
    D_s     = mean_k d[s, k]                                            (the site's column)
    D       = mean_s D_s                                                (the "average" column: each site once)

Why seeds and not cases: retraining moves a cell far more than the finite test set does (on this project's
synthetic prostate set the seed SD of a cell is about 0.05 Dice, eight times the case-level standard error). An
interval that resamples the cases of one trained network answers "is this network better than that one on these
cases", not "is this method better than the baseline".

* **Interval** (:func:`two_level_distribution`): a two-level bootstrap. At every site, independently (stratified
  by site, as the average column gives every site the same weight), draw ``K_s`` seeds with replacement, then for
  every drawn seed draw its ``n_s`` cases with replacement (both scores of a case together); the statistic of a
  resample is ``D`` computed on the drawn values. Both sources of variation enter: retraining (the seeds) and the
  finite test set (the cases within a seed). The interval is the percentile interval of these resamples. It is
  approximate with few seeds: the seed level's bootstrap variance is the plug-in one (shrunk by ``(K-1)/K``), so
  with 3-5 seeds the interval is somewhat too narrow; that is why decisions use the exact test below, and why a
  cell with fewer than :data:`MIN_SEEDS` paired seeds gets no interval at all (its seed values are shown instead).
* **p-value** (:func:`sign_flip_test`): a sign-flip permutation test on the paired seed differences. Under the null
  hypothesis "the method does not change held-out Dice", the two models of one seed are exchangeable, so every
  ``d[s, k]`` is symmetric about zero and its sign can be flipped. All ``2^N`` sign patterns of the ``N`` paired
  differences are enumerated when ``N <= 20`` (the p-value is exact, a multiple of ``2^-N``; its smallest value
  is ``2 / 2^N``, two-sided: 0.25 with 3 seeds, 0.0625 with 5, so one site with 5 seeds can never be resolved at
  0.05); beyond that ``B`` random patterns are drawn and the p-value is the share reaching the observed ``|D|``,
  printed as ``< 1/B`` when none does (never a floor passed off as a measurement).
* **Power** (:func:`minimum_detectable_difference`): the smallest true difference that the measured seed SD and
  seed count resolve with probability ``power`` at level ``alpha`` (paired t approximation,
  ``(t_{1-alpha/2, df} + t_{power, df}) * SE``), and the seeds per site that would resolve
  :data:`DIFFERENCE_THAT_MATTERS`. A comparison that is not significant is "not resolved at N seeds", never "no
  difference".
* :func:`holm`: Holm-Bonferroni adjusted p-values across the methods compared with one baseline.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

import numpy as np
from scipy import stats

__all__ = ["DIFFERENCE_THAT_MATTERS", "MIN_SEEDS", "PValue", "SeedDifference", "compare_seeds", "holm",
           "minimum_detectable_difference", "seeds_needed", "sign_flip_test", "two_level_distribution"]

Scores = Union[Sequence[float], np.ndarray]
# site -> seed -> (method's per-case scores, baseline's per-case scores), the cases in the same order.
PairedRuns = Mapping[str, Mapping[int, tuple[Scores, Scores]]]

MIN_SEEDS = 3  # paired seeds per site below which a cell shows its seed values and no interval
# The smallest difference in mean held-out Dice over the sites that we would call an improvement: the FedDG papers
# report method gains of 0.5-3 Dice points on their average columns, and 0.01 (one point) is about the smallest gain
# they present as one. The tables say how many seeds per site would resolve it at the measured seed SD.
DIFFERENCE_THAT_MATTERS = 0.01
ALPHA = 0.05
POWER = 0.8
EXACT_FLIPS = 20  # enumerate every sign pattern up to this many paired differences (2^20 patterns)


@dataclass(frozen=True)
class PValue:
    """A p-value and how it was obtained: ``'exact'`` (every sign pattern), ``'monte-carlo'`` (``resamples``
    random patterns) or ``'bound'`` (no random pattern reached the observed statistic: the p-value is below
    ``value = 1 / resamples``)."""

    value: float
    kind: str
    resamples: int = 0

    def format(self, digits: int = 3) -> str:
        if self.kind == "bound":
            return f"< {self.value:.2g}"
        return f"{self.value:.{digits}f}" if self.value >= 10 ** -digits else f"{self.value:.1e}"

    def to_dict(self) -> dict[str, Any]:
        return {"value": float(self.value), "kind": self.kind, "resamples": int(self.resamples)}


@dataclass(frozen=True)
class SeedDifference:
    """A method's difference to a baseline with seeds as the unit (see the module docstring).

    ``mean``: D (or D_s for one site); ``seeds``: site -> seed -> the paired difference d[s, k]; ``sd``: the pooled
    SD of the paired seed differences (square root of the mean over sites of their variances, ddof 1; None with
    fewer than 2 seeds at a site); ``low``/``high``: the two-level bootstrap interval, None when a site has fewer
    than :data:`MIN_SEEDS` paired seeds; ``p``: the sign-flip p-value (None as the interval); ``min_p``: the smallest
    p-value the sign-flip test can give with these seeds; ``mde``: the smallest difference resolvable at
    :data:`POWER` (None without an SD, or when even ``min_p`` exceeds :data:`ALPHA`: then no difference can be
    resolved at these seeds); ``seeds_for_target``: seeds per site that would resolve
    :data:`DIFFERENCE_THAT_MATTERS` at the measured SD.
    """

    mean: float
    seeds: dict[str, dict[int, float]]
    sd: float | None
    low: float | None
    high: float | None
    p: PValue | None
    min_p: float
    mde: float | None
    seeds_for_target: int | None
    confidence: float

    @property
    def n_seeds(self) -> int:
        """The paired seeds of the site with the fewest (the count that limits the comparison)."""
        return min(len(v) for v in self.seeds.values())

    @property
    def has_interval(self) -> bool:
        return self.low is not None and self.high is not None

    def resolved(self, p_adjusted: PValue | None = None, alpha: float = ALPHA) -> bool:
        """Significant at ``alpha`` (with ``p_adjusted`` when given, e.g. Holm's) and the interval excludes 0."""
        p = p_adjusted or self.p
        if p is None or not self.has_interval:
            return False
        return p.value <= alpha and (self.low > 0 or self.high < 0)

    def format(self, digits: int = 3) -> str:
        """``+0.044 [-0.012, +0.091] 5 seeds, SD 0.049``; with fewer than :data:`MIN_SEEDS` seeds no interval: at one
        site each seed's difference, ``+0.044 (2 seeds: +0.051, +0.037)`` or ``+0.042 (1 seed)``, over several
        sites the seed counts, ``+0.079 (1-3 seeds per site)``."""
        if not self.has_interval:  # fewer than MIN_SEEDS at some site: the seed values, no interval
            counts = [len(v) for v in self.seeds.values()]
            if len(self.seeds) > 1:
                low, high = min(counts), max(counts)
                span = f"{low}" if low == high else f"{low}-{high}"
                return f"{self.mean:+.{digits}f} ({span} seed{'s' if high > 1 else ''} per site)"
            values = [d for per_site in self.seeds.values() for d in per_site.values()]
            if len(values) == 1:
                return f"{self.mean:+.{digits}f} (1 seed)"
            return f"{self.mean:+.{digits}f} ({len(values)} seeds: {', '.join(f'{d:+.{digits}f}' for d in values)})"
        sd = "" if self.sd is None else f", SD {self.sd:.{digits}f}"
        return (f"{self.mean:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}] "
                f"{self.n_seeds} seeds{sd}")

    def to_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "low": self.low, "high": self.high, "confidence": self.confidence,
                "p": None if self.p is None else self.p.to_dict(), "min_p": self.min_p, "sd": self.sd,
                "mde": self.mde, "seeds_for_target": self.seeds_for_target, "n_seeds": self.n_seeds,
                "seed_differences": {s: {str(k): d for k, d in v.items()} for s, v in self.seeds.items()}}


def compare_seeds(runs: PairedRuns, *, confidence: float = 0.95, n_resamples: int = 9999, seed: int = 0,
                  alpha: float = ALPHA, power: float = POWER) -> SeedDifference:
    """The difference ``method - baseline`` over the sites of ``runs`` (one site: that site's column).

    ``runs``: site -> seed -> (method's scores, baseline's scores), each of shape ``(n_cases_site,)``, the same
    cases in the same order for every seed of the site (at least one site, at least one seed per site, at least
    one case, finite numbers). Only seeds run for both methods belong in ``runs``.
    """
    _check_options(confidence, n_resamples)
    cases = _case_differences(runs)  # site -> (K_s, n_s)
    seeds = {site: {k: float(np.mean(d)) for k, d in zip(sorted(runs[site]), diffs)} for site, diffs in cases.items()}
    mean = float(np.mean([np.mean(list(v.values())) for v in seeds.values()]))
    counts = {site: len(v) for site, v in seeds.items()}
    sd = _pooled_sd(seeds)
    n_flips = sum(counts.values())
    min_p = min(1.0, 2.0 / 2 ** n_flips)
    low = high = p = None
    if min(counts.values()) >= MIN_SEEDS:
        distribution = two_level_distribution(cases, n_resamples, np.random.default_rng(seed))
        tail = (1.0 - confidence) / 2
        low, high = (float(q) for q in np.quantile(distribution, [tail, 1.0 - tail]))
        p = sign_flip_test(seeds, n_resamples=n_resamples, seed=seed)
    mde = None
    if sd is not None and min_p <= alpha:
        mde = minimum_detectable_difference(sd, counts, alpha=alpha, power=power)
    target = None if sd is None else seeds_needed(sd, len(counts), alpha=alpha, power=power)
    return SeedDifference(mean=mean, seeds=seeds, sd=sd, low=low, high=high, p=p, min_p=min_p, mde=mde,
                          seeds_for_target=target, confidence=float(confidence))


def two_level_distribution(cases: Mapping[str, np.ndarray], n_resamples: int, rng: np.random.Generator,
                           chunk: int = 2000) -> np.ndarray:
    """``(n_resamples,)`` bootstrap values of ``D``: at every site independently, seeds drawn with replacement,
    then each drawn seed's cases drawn with replacement.

    ``cases``: site -> array ``(K_s, n_s)`` of per-case differences (row k: seed k's cases, method - baseline).
    Sites are drawn in the mapping's order, so a fixed ``rng`` state gives a reproducible distribution.
    """
    out = np.zeros(n_resamples)
    for start in range(0, n_resamples, chunk):
        b = min(chunk, n_resamples - start)
        total = np.zeros(b)
        for diffs in cases.values():
            k, n = diffs.shape
            seed_idx = rng.integers(0, k, size=(b, k))
            case_idx = rng.integers(0, n, size=(b, k, n))
            total += diffs[seed_idx[:, :, None], case_idx].mean(axis=(1, 2))
        out[start:start + b] = total / len(cases)
    return out


def sign_flip_test(seeds: Mapping[str, Mapping[int, float]], *, n_resamples: int = 9999, seed: int = 0,
                   exact_up_to: int = EXACT_FLIPS) -> PValue:
    """Two-sided sign-flip permutation p-value of ``D`` (mean over sites of the mean paired seed difference).

    Every paired difference gets its own sign (``D*`` = mean over sites of mean over seeds of ``+-d[s, k]``); the
    p-value is the share of sign patterns with ``|D*| >= |D|``. Exact (every pattern) up to ``exact_up_to``
    differences, else ``n_resamples`` random patterns (``'bound'`` when none reaches ``|D|``).
    """
    values, weights = [], []
    for per_site in seeds.values():
        for d in per_site.values():
            values.append(float(d))
            weights.append(1.0 / (len(per_site) * len(seeds)))
    contribution = np.asarray(values) * np.asarray(weights)  # D = sum(contribution)
    observed = abs(float(np.sum(contribution)))
    # A pattern that reproduces |D| up to rounding counts as reaching it (the identity pattern always does).
    tolerance = 1e-12 * max(1.0, float(np.sum(np.abs(contribution))))
    n = contribution.size
    if n <= exact_up_to:
        reached = 0
        for start in range(0, 2 ** n, 1 << 16):
            patterns = np.arange(start, min(2 ** n, start + (1 << 16)), dtype=np.int64)
            signs = 1.0 - 2.0 * ((patterns[:, None] >> np.arange(n)) & 1)
            reached += int(np.sum(np.abs(signs @ contribution) >= observed - tolerance))
        return PValue(reached / 2 ** n, "exact")
    rng = np.random.default_rng(seed)
    signs = rng.choice((-1.0, 1.0), size=(n_resamples, n))
    reached = int(np.sum(np.abs(signs @ contribution) >= observed - tolerance))
    if reached == 0:
        return PValue(1.0 / n_resamples, "bound", n_resamples)
    return PValue(reached / n_resamples, "monte-carlo", n_resamples)


def minimum_detectable_difference(sd: float, seeds_per_site: Mapping[str, int], *, alpha: float = ALPHA,
                                  power: float = POWER) -> float | None:
    """The smallest true ``D`` resolved with probability ``power`` by a two-sided test at ``alpha``:
    ``(t_{1-alpha/2, df} + t_{power, df}) * SE`` with ``SE = sd * sqrt(sum_s 1/K_s) / S`` and
    ``df = sum_s (K_s - 1)`` (the paired t approximation; None when ``df`` is 0)."""
    counts = list(seeds_per_site.values())
    df = sum(k - 1 for k in counts)
    if df < 1:
        return None
    se = sd * math.sqrt(sum(1.0 / k for k in counts)) / len(counts)
    return float((stats.t.ppf(1 - alpha / 2, df) + stats.t.ppf(power, df)) * se)


def seeds_needed(sd: float, n_sites: int, target: float = DIFFERENCE_THAT_MATTERS, *, alpha: float = ALPHA,
                 power: float = POWER, most: int = 10_000) -> int | None:
    """Seeds per site (the same at every site) for :func:`minimum_detectable_difference` to reach ``target``;
    None when more than ``most`` would be needed (or ``sd`` is 0: then 2 suffice)."""
    if sd == 0:
        return 2
    for k in range(2, most + 1):
        mde = minimum_detectable_difference(sd, {str(s): k for s in range(n_sites)}, alpha=alpha, power=power)
        if mde is not None and mde <= target:
            return k
    return None


def holm(pvalues: Mapping[str, PValue]) -> dict[str, PValue]:
    """Holm-Bonferroni adjusted p-values (step-down), same keys as ``pvalues``.

    With the ``m`` p-values sorted ascending, the adjusted value of the ``i``-th is
    ``min(1, max_{j <= i} (m - j + 1) * p_(j))``. An adjusted value that comes from a bound (``< 1/B``) stays a
    bound: ``< (m - j + 1) / B``.
    """
    # Written here: scipy.stats.false_discovery_control is Benjamini-Hochberg / Benjamini-Yekutieli (false
    # discovery rate), not Holm (family-wise error rate), and scipy has no Holm correction.
    for key, p in pvalues.items():
        if not (isinstance(p, PValue) and 0.0 <= p.value <= 1.0):
            raise ValueError(f"p-value of {key!r} must be a PValue in [0, 1], got {p!r}")
    ordered = sorted(pvalues.items(), key=lambda item: item[1].value)
    m = len(ordered)
    adjusted: dict[str, PValue] = {}
    running = PValue(0.0, "exact")
    for rank, (key, p) in enumerate(ordered):
        scaled = PValue(min(1.0, (m - rank) * p.value), p.kind, p.resamples)
        if scaled.value > running.value or rank == 0:
            running = scaled
        adjusted[key] = running
    return {key: adjusted[key] for key in pvalues}


# -- internals ---------------------------------------------------------------------------------------------------


def _case_differences(runs: PairedRuns) -> dict[str, np.ndarray]:
    if not runs:
        raise ValueError("no sites to compare: need site -> seed -> (method scores, baseline scores)")
    out = {}
    for site, per_seed in runs.items():
        if not per_seed:
            raise ValueError(f"site {site!r}: no seed run for both methods")
        rows = []
        for k in sorted(per_seed):
            pair = per_seed[k]
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise ValueError(f"site {site!r}, seed {k}: expected a pair (method scores, baseline scores)")
            a = _as_scores(pair[0], f"site {site!r}, seed {k}: method scores")
            b = _as_scores(pair[1], f"site {site!r}, seed {k}: baseline scores")
            if a.shape != b.shape:
                raise ValueError(f"site {site!r}, seed {k}: the method scored {a.size} cases, the baseline "
                                 f"{b.size}; they must hold the same cases in the same order")
            rows.append(a - b)
        if len({r.size for r in rows}) != 1:
            raise ValueError(f"site {site!r}: the seeds scored different numbers of cases "
                             f"({[r.size for r in rows]}); every seed must be tested on the same cases")
        out[site] = np.stack(rows)
    return out


def _pooled_sd(seeds: Mapping[str, Mapping[int, float]]) -> float | None:
    if any(len(v) < 2 for v in seeds.values()):
        return None
    return float(math.sqrt(np.mean([np.var(list(v.values()), ddof=1) for v in seeds.values()])))


def _as_scores(values: Scores, what: str) -> np.ndarray:
    try:
        array = np.asarray(values, dtype=float)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{what} must be numbers: {error}") from None
    if array.ndim != 1 or array.size < 1:
        raise ValueError(f"{what} must be one-dimensional and non-empty (one score per case), got shape "
                         f"{array.shape}")
    bad = np.flatnonzero(~np.isfinite(array))
    if bad.size:
        raise ValueError(f"{what} contain non-finite values (NaN or inf) at case index(es) {bad.tolist()[:10]}")
    return array


def _check_options(confidence: float, n_resamples: int) -> None:
    if not (isinstance(confidence, (int, float)) and 0.0 < float(confidence) < 1.0):
        raise ValueError(f"confidence must be strictly between 0 and 1, got {confidence!r}")
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)) or n_resamples < 1:
        raise ValueError(f"n_resamples must be a positive integer, got {n_resamples!r}")
