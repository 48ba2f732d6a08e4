"""Statistics for comparing a FedDG method with a baseline, with the training seed as the unit of inference.

A leave-one-site-out cell (method, held-out site) is trained with several seeds. Seed ``k`` of every method starts
from the same initial weights, reads the data in the same order and draws the same augmentation, so seed ``k`` of a
method and seed ``k`` of the baseline form a pair. One trained model is summarised by the mean Dice over the
held-out site's test cases; the comparison at site ``s`` is built on the paired seed differences::

    d[s, k] = mean_i x_method[s, k, i] - mean_i x_baseline[s, k, i]      (i: the site's test cases)
    D_s     = mean_k d[s, k]                                            (the site's column)
    D_k     = mean_s d[s, k]                                            (seed k's average over the sites)
    D       = mean_k D_k                                                (the "average" column: each site once)

Why seeds and not cases: retraining moves a cell far more than the finite test set does (on this project's
synthetic prostate set the seed SD of a cell is about 0.05 Dice, eight times the case-level standard error). An
interval that resamples the cases of one trained network answers "is this network better than that one on these
cases", not "is this method better than the baseline".

Why the seed, and not the site x seed pair, is the unit of the average column: the runs that share seed ``k`` at
different held-out sites share their initial weights and data order by design, so ``d[s, k]`` and ``d[s', k]`` are
not independent draws; the independent draws are the seeds. The sites are not a sample of hospitals either: they
are the fixed conditions of the design (the four or six held-out sites of the task), so a verdict holds for these
sites, and says so. The average column is therefore tested on the ``K`` per-seed averages ``D_k`` (the seeds run at
every site), a site's column on its ``K`` differences ``d[s, k]``:

* **Decision test** (:func:`paired_t_test`): a one-sample t-test of those ``K`` values against 0 (``df = K - 1``),
  Holm-adjusted over the methods compared with one baseline (:func:`holm`; a method with too few seeds to test counts
  as not rejected). It can resolve a difference at 5 seeds.
* **Distribution-free check** (:func:`sign_flip_test`): the exact sign-flip test over the same ``K`` values, printed
  beside it with its floor ``2 / 2^K`` (0.25 at 3 seeds, 0.0625 at 5, 0.4375 after Holm over 7 methods): with the
  seed as the unit it can never resolve anything at 5 seeds, which is why it is not the decision test. Pooling the
  ``S x K`` site-seed differences as independent units (what this module did before) reached 2/2^20 at 5 seeds and 4
  sites; that is exact only if the runs of one seed at different sites were independent, and they are not.
* **Interval** (:func:`crossed_distribution`): a bootstrap of the crossed design: each replicate draws ``K`` seeds
  with replacement (the same draw at every site: the seed is the unit), and at each site draws its test cases once
  with replacement for all the drawn seeds (every seed is scored on the same cases, and per-case differences
  correlate across seeds); the statistic is ``D`` computed on the drawn values; the interval is the percentile
  interval. With 3-5 seeds it is approximate (the seed level's bootstrap variance is the plug-in one); a cell with
  fewer than :data:`MIN_SEEDS` seeds gets no interval (its seed values are shown instead).
* **Power** (:func:`minimum_detectable_difference`): the smallest true difference the same t-test resolves with
  probability ``power`` at level ``alpha``, ``(t_{1-alpha/2, K-1} + t_{power, K-1}) * SD / sqrt(K)`` with the SD of
  the ``K`` tested values, and the seeds that would resolve :data:`DIFFERENCE_THAT_MATTERS` (:func:`seeds_needed`).
  A comparison that is not significant is "not resolved at K seeds", never "no difference".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

import numpy as np
from scipy import stats

__all__ = ["DIFFERENCE_THAT_MATTERS", "MIN_SEEDS", "PValue", "SeedDifference", "common_seeds", "compare_seeds",
           "crossed_distribution", "holm", "minimum_detectable_difference", "paired_t_test", "seeds_needed",
           "sign_flip_test"]

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
    """A p-value and how it was obtained: ``'t'`` (the paired t-test), ``'exact'`` (every sign pattern),
    ``'monte-carlo'`` (``resamples`` random patterns) or ``'bound'`` (no random pattern reached the observed
    statistic: the p-value is below ``value = 1 / resamples``)."""

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
    """A method's difference to a baseline with the seed as the unit (see the module docstring).

    ``mean``: D (or D_s for one site), over the tested seeds; ``seeds``: site -> seed -> the paired difference
    d[s, k]; ``tested``: seed -> the tested value (D_k, or d[s, k] for one site), for the seeds run at every site;
    ``sd``: the SD of the tested values (ddof 1; None below 2 seeds); ``low``/``high``: the crossed bootstrap
    interval, None below :data:`MIN_SEEDS` seeds; ``p``: the paired t-test's p-value (None as the interval);
    ``flip_p``: the exact sign-flip p-value over the same values, ``min_p`` its floor ``2 / 2^K``; ``mde``: the
    smallest difference the t-test resolves at :data:`POWER` (None without an SD); ``seeds_for_target``: seeds that
    would resolve :data:`DIFFERENCE_THAT_MATTERS` at the measured SD.
    """

    mean: float
    seeds: dict[str, dict[int, float]]
    tested: dict[int, float]
    sd: float | None
    low: float | None
    high: float | None
    p: PValue | None
    flip_p: PValue | None
    min_p: float
    mde: float | None
    seeds_for_target: int | None
    confidence: float

    @property
    def n_seeds(self) -> int:
        """The seeds tested: those run for both methods at every site of the comparison."""
        return len(self.tested)

    @property
    def has_interval(self) -> bool:
        return self.low is not None and self.high is not None

    @property
    def sites_ahead(self) -> int:
        """The sites whose own difference D_s is above 0."""
        return sum(float(np.mean(list(v.values()))) > 0 for v in self.seeds.values())

    def resolved(self, p_adjusted: PValue | None = None, alpha: float = ALPHA) -> bool:
        """Significant at ``alpha`` (with ``p_adjusted`` when given, e.g. Holm's) and the interval excludes 0."""
        p = p_adjusted or self.p
        if p is None or not self.has_interval:
            return False
        return p.value <= alpha and (self.low > 0 or self.high < 0)

    def format(self, digits: int = 3) -> str:
        """``+0.044 [-0.012, +0.091] 5 seeds, SD 0.049``; with fewer than :data:`MIN_SEEDS` seeds no interval: at one
        site each seed's difference, ``+0.044 (2 seeds: +0.051, +0.037)`` or ``+0.042 (1 seed)``, over several
        sites the seeds run at every site and their site averages D_k, the values the mean is over: ``+0.009 (seeds
        3-4, run at every site: +0.012, +0.006)``."""
        if not self.has_interval:  # fewer than MIN_SEEDS: the seed values, no interval
            if len(self.seeds) > 1:
                return (f"{self.mean:+.{digits}f} ({seed_list(list(self.tested))}, run at every site: "
                        f"{', '.join(f'{d:+.{digits}f}' for d in self.tested.values())})")
            values = [d for per_site in self.seeds.values() for d in per_site.values()]
            if len(values) == 1:
                return f"{self.mean:+.{digits}f} (1 seed)"
            return f"{self.mean:+.{digits}f} ({len(values)} seeds: {', '.join(f'{d:+.{digits}f}' for d in values)})"
        sd = "" if self.sd is None else f", SD {self.sd:.{digits}f}"
        return (f"{self.mean:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}] "
                f"{self.n_seeds} seeds{sd}")

    def to_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "low": self.low, "high": self.high, "confidence": self.confidence,
                "p": None if self.p is None else self.p.to_dict(), "test": "paired t over seeds",
                "flip_p": None if self.flip_p is None else self.flip_p.to_dict(), "min_p": self.min_p,
                "sd": self.sd, "mde": self.mde, "seeds_for_target": self.seeds_for_target, "n_seeds": self.n_seeds,
                "tested": {str(k): d for k, d in self.tested.items()},
                "seed_differences": {s: {str(k): d for k, d in v.items()} for s, v in self.seeds.items()}}


def seed_list(seeds: Sequence[int]) -> str:
    """``[0, 3, 4, 5]`` -> ``seeds 0, 3-5``; ``[5]`` -> ``seed 5`` (sorted, unique seeds): the one way the
    benchmark's tables and sentences name a set of seeds."""
    runs: list[list[int]] = []
    for seed in seeds:
        if runs and seed == runs[-1][-1] + 1:
            runs[-1].append(seed)
        else:
            runs.append([seed])
    listed = ", ".join(f"{r[0]}" if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
    return f"seed{'s' if len(seeds) > 1 else ''} {listed}"


def common_seeds(per_site: Iterable[Mapping[int, Any]]) -> list[int]:
    """The seeds present at every site (each a seed -> value mapping), sorted: the seeds an average is over."""
    return sorted(set.intersection(*(set(v) for v in per_site)))


def compare_seeds(runs: PairedRuns, *, confidence: float = 0.95, n_resamples: int = 9999, seed: int = 0,
                  alpha: float = ALPHA, power: float = POWER) -> SeedDifference:
    """The difference ``method - baseline`` over the sites of ``runs`` (one site: that site's column), the seed as
    the unit: the values tested are D_k over the seeds run at every site (see the module docstring).

    ``runs``: site -> seed -> (method's scores, baseline's scores), each of shape ``(n_cases_site,)``, the same
    cases in the same order for every seed of the site (at least one site, at least one seed per site, at least
    one case, finite numbers). Only seeds run for both methods belong in ``runs``.
    """
    _check_options(confidence, n_resamples)
    cases = _case_differences(runs)  # site -> (K_s, n_s), rows in sorted seed order
    seeds = {site: {k: float(np.mean(d)) for k, d in zip(sorted(runs[site]), diffs)} for site, diffs in cases.items()}
    common = common_seeds(seeds.values())
    if not common:
        raise ValueError(f"no seed was run at every site {sorted(seeds)}: the average needs the same seeds")
    tested = {k: float(np.mean([seeds[site][k] for site in seeds])) for k in common}
    values = np.array(list(tested.values()))
    mean = float(np.mean(values))
    sd = float(np.std(values, ddof=1)) if values.size >= 2 else None
    min_p = min(1.0, 2.0 / 2 ** values.size)
    low = high = p = flip_p = None
    if values.size >= MIN_SEEDS:
        rows = {site: diffs[[sorted(runs[site]).index(k) for k in common]] for site, diffs in cases.items()}
        distribution = crossed_distribution(rows, n_resamples, np.random.default_rng(seed))
        tail = (1.0 - confidence) / 2
        low, high = (float(q) for q in np.quantile(distribution, [tail, 1.0 - tail]))
        p = paired_t_test(values)
        flip_p = sign_flip_test(values, n_resamples=n_resamples, seed=seed)
    mde = None if sd is None else minimum_detectable_difference(sd, values.size, alpha=alpha, power=power)
    target = None if sd is None else seeds_needed(sd, alpha=alpha, power=power)
    return SeedDifference(mean=mean, seeds=seeds, tested=tested, sd=sd, low=low, high=high, p=p, flip_p=flip_p,
                          min_p=min_p, mde=mde, seeds_for_target=target, confidence=float(confidence))


def paired_t_test(values: Sequence[float] | np.ndarray) -> PValue:
    """Two-sided p-value of a one-sample t-test of ``values`` (the K paired seed values) against 0, ``df = K - 1``
    (``scipy.stats.ttest_1samp``); with no spread at all, 0 for a non-zero mean and 1 for a zero one."""
    array = np.asarray(values, dtype=float)
    if array.size < 2:
        raise ValueError(f"a t-test needs 2 or more seeds, got {array.size}")
    if np.all(array == array[0]):
        return PValue(0.0 if array[0] != 0 else 1.0, "t")
    return PValue(float(stats.ttest_1samp(array, 0.0).pvalue), "t")


def crossed_distribution(cases: Mapping[str, np.ndarray], n_resamples: int, rng: np.random.Generator,
                         chunk: int = 2000) -> np.ndarray:
    """``(n_resamples,)`` bootstrap values of ``D`` for the crossed design: each replicate draws the K seeds with
    replacement (one draw for every site), and at each site its n_s cases with replacement once, for all the drawn
    seeds.

    ``cases``: site -> array ``(K, n_s)`` of per-case differences (row k: seed k's cases, method - baseline), the
    same K seeds in the same order at every site. Sites are drawn in the mapping's order, so a fixed ``rng`` state
    gives a reproducible distribution.
    """
    ks = {diffs.shape[0] for diffs in cases.values()}
    if len(ks) != 1:
        raise ValueError(f"the crossed bootstrap needs the same seeds at every site, got {sorted(ks)} seeds")
    k = ks.pop()
    out = np.zeros(n_resamples)
    for start in range(0, n_resamples, chunk):
        b = min(chunk, n_resamples - start)
        seed_idx = rng.integers(0, k, size=(b, k))
        total = np.zeros(b)
        for diffs in cases.values():
            n = diffs.shape[1]
            case_idx = rng.integers(0, n, size=(b, n))
            total += diffs[seed_idx[:, :, None], case_idx[:, None, :]].mean(axis=(1, 2))
        out[start:start + b] = total / len(cases)
    return out


def sign_flip_test(values: Sequence[float] | np.ndarray, *, n_resamples: int = 9999, seed: int = 0,
                   exact_up_to: int = EXACT_FLIPS) -> PValue:
    """Two-sided sign-flip permutation p-value of the mean of ``values`` (the K tested seed values): the share of
    sign patterns ``+-values`` whose mean reaches ``|mean|``. Exact (every pattern; the floor is ``2 / 2^K``) up to
    ``exact_up_to`` values, else ``n_resamples`` random patterns (``'bound'`` when none reaches it)."""
    contribution = np.asarray(values, dtype=float) / max(1, len(values))
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


def minimum_detectable_difference(sd: float, n_seeds: int, *, alpha: float = ALPHA,
                                  power: float = POWER) -> float | None:
    """The smallest true difference that the paired t-test over ``n_seeds`` seed values with SD ``sd`` resolves with
    probability ``power`` at two-sided level ``alpha``: ``(t_{1-alpha/2, K-1} + t_{power, K-1}) * sd / sqrt(K)``
    (None below 2 seeds)."""
    if n_seeds < 2:
        return None
    df = n_seeds - 1
    return float((stats.t.ppf(1 - alpha / 2, df) + stats.t.ppf(power, df)) * sd / math.sqrt(n_seeds))


def seeds_needed(sd: float, target: float = DIFFERENCE_THAT_MATTERS, *, alpha: float = ALPHA,
                 power: float = POWER, most: int = 10_000) -> int | None:
    """Seeds for :func:`minimum_detectable_difference` to reach ``target``; None when more than ``most`` would be
    needed (2 when ``sd`` is 0)."""
    if sd == 0:
        return 2
    for k in range(2, most + 1):
        mde = minimum_detectable_difference(sd, k, alpha=alpha, power=power)
        if mde is not None and mde <= target:
            return k
    return None


def holm(pvalues: Mapping[str, PValue], family: int | None = None) -> dict[str, PValue]:
    """Holm-Bonferroni adjusted p-values (step-down), same keys as ``pvalues``.

    With the family's ``m`` p-values sorted ascending, the adjusted value of the ``i``-th is
    ``min(1, max_{j <= i} (m - j + 1) * p_(j))``. An adjusted value that comes from a bound (``< 1/B``) stays a
    bound: ``< (m - j + 1) / B``. ``family``: the number of hypotheses in the family, ``m`` (default: the
    p-values given); a member without a p-value yet (a comparison with too few seeds to test) is counted as not
    rejected, ``p = 1``: it sorts last, so it scales every given p-value by the full family and is not returned.
    """
    # Written here: scipy.stats.false_discovery_control is Benjamini-Hochberg / Benjamini-Yekutieli (false
    # discovery rate), not Holm (family-wise error rate), and scipy has no Holm correction.
    for key, p in pvalues.items():
        if not (isinstance(p, PValue) and 0.0 <= p.value <= 1.0):
            raise ValueError(f"p-value of {key!r} must be a PValue in [0, 1], got {p!r}")
    ordered = sorted(pvalues.items(), key=lambda item: item[1].value)
    m = len(ordered) if family is None else family
    if m < len(ordered):
        raise ValueError(f"a family of {family} cannot hold the {len(ordered)} p-values given")
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
