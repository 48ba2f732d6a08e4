"""Seed-level statistics, the seed as the unit: the paired t-test against scipy and a hand-worked example where the
old pooled site x seed test and the per-seed test disagree, the crossed bootstrap against a brute-force enumeration,
the sign-flip check and its floor, power, Holm's correction, and cells with too few seeds."""

from __future__ import annotations

import itertools
import json
from collections import Counter

import numpy as np
import pytest
from scipy import stats as scipy_stats

from feddg.benchmark.stats import (
    PValue,
    compare_seeds,
    crossed_distribution,
    holm,
    minimum_detectable_difference,
    paired_t_test,
    seeds_needed,
    sign_flip_test,
)


def _runs(differences: dict[str, np.ndarray], base: float = 0.5) -> dict:
    """The paired-runs mapping for per-case differences (site -> (seeds, cases)): baseline ``base``, method
    ``base + d``."""
    return {site: {k: (base + row, np.full_like(row, base)) for k, row in enumerate(d)}
            for site, d in differences.items()}


# 3 sites x 4 seeds with a seed effect shared by the sites: seed 3 is bad for the method at every site.
# d[s, k] (one case per seed, so a seed's difference is its case's):
SHARED = {s: np.array([[0.10], [0.10], [0.10], [-0.06]]) for s in "ABC"}
# Per seed, D_k = [0.10, 0.10, 0.10, -0.06]: mean 0.06; deviations 0.04 x3 and -0.12: sum of squares 0.0192,
# variance 0.0192 / 3 = 0.0064, SD 0.08, SE 0.08 / 2 = 0.04, t = 1.5 with df 3: two-sided p = 0.2306.
# Sign flip over the 4 values: |sum of +-values| >= 0.24 only with the three 0.10 of one sign: 4 of 16, p = 0.25.
# Pooled as 12 independent units (the old test): |sum| >= 0.72 of 9 x +-0.10 and 3 x +-0.06: all nine 0.10 of one
# sign (x 8 patterns of the rest, twice: 16) or eight of them (9 ways) with at least two of the three 0.06 on the
# same side (4 patterns, twice: 72): 88 of 4096 = 0.0215, "resolved" at 0.05 although only 4 independent seeds are.
SHARED_T_P = 0.2306


def test_the_seed_is_the_unit_where_the_pooled_test_disagrees():
    result = compare_seeds(_runs(SHARED), n_resamples=2000)
    assert result.mean == pytest.approx(0.06) and result.tested == pytest.approx({0: 0.1, 1: 0.1, 2: 0.1, 3: -0.06})
    assert result.sd == pytest.approx(0.08) and result.n_seeds == 4
    assert result.p == PValue(pytest.approx(SHARED_T_P, abs=1e-4), "t")
    assert result.flip_p == PValue(0.25, "exact") and result.min_p == pytest.approx(2 / 16)
    pooled = sign_flip_test([d for site in SHARED.values() for d in site[:, 0]])
    assert pooled == PValue(pytest.approx(88 / 4096), "exact")  # what the pooled test said: below 0.05
    assert not result.resolved() and result.sites_ahead == 3


def test_the_t_test_is_scipys_one_sample_t_on_the_seed_values():
    rng = np.random.default_rng(3)
    for k in (3, 5, 8):
        values = rng.normal(0.01, 0.02, k)
        assert paired_t_test(values).value == pytest.approx(scipy_stats.ttest_1samp(values, 0.0).pvalue, rel=1e-12)
    assert paired_t_test([0.1, 0.1, 0.1]) == PValue(0.0, "t") and paired_t_test([0.0, 0.0]) == PValue(1.0, "t")
    with pytest.raises(ValueError, match="2 or more seeds"):
        paired_t_test([0.1])


def test_the_average_uses_the_seeds_run_at_every_site():
    diffs = {"A": np.array([[0.1], [0.2], [0.3]]), "B": np.array([[0.0], [0.1]])}
    runs = _runs(diffs)
    result = compare_seeds(runs, n_resamples=200)
    assert result.tested == pytest.approx({0: 0.05, 1: 0.15}) and result.n_seeds == 2 and not result.has_interval
    assert result.seeds["A"] == pytest.approx({0: 0.1, 1: 0.2, 2: 0.3})  # each site's own column keeps its seeds


# -- the crossed bootstrap -----------------------------------------------------------------------------------------


def test_crossed_bootstrap_matches_a_brute_force_enumeration():
    """One site, 2 seeds x 2 cases: a replicate draws 2 seeds (4 ways) and, once for both, 2 cases (4 ways); the
    16 outcomes are equally likely, each the mean of the drawn seeds' drawn cases."""
    diffs = np.array([[0.0, 1.0], [2.0, 4.0]])
    exact: Counter = Counter()
    for seeds in itertools.product(range(2), repeat=2):
        for cases in itertools.product(range(2), repeat=2):
            exact[round(float(np.mean([diffs[k, i] for k in seeds for i in cases])), 9)] += 1 / 16
    sampled = crossed_distribution({"A": diffs}, 160_000, np.random.default_rng(2))
    seen = Counter(round(float(v), 9) for v in sampled)
    assert set(seen) == set(exact)
    for value, share in exact.items():
        assert seen[value] / sampled.size == pytest.approx(share, abs=0.005)


def test_crossed_bootstrap_draws_one_seed_set_for_every_site():
    """Two sites whose seed 0 is +1 and seed 1 is 0: a shared draw gives D* in {0, 0.5, 1}; independent draws at the
    two sites would also give 0.25 and 0.75."""
    diffs = {"A": np.array([[1.0], [0.0]]), "B": np.array([[1.0], [0.0]])}
    values = crossed_distribution(diffs, 20_000, np.random.default_rng(0))
    assert set(np.round(values, 9)) == {0.0, 0.5, 1.0}
    with pytest.raises(ValueError, match="same seeds at every site"):
        crossed_distribution({"A": np.zeros((3, 2)), "B": np.zeros((2, 2))}, 10, np.random.default_rng(0))


def test_the_interval_is_reproducible_and_contains_the_estimate():
    rng = np.random.default_rng(1)
    diffs = {s: 0.02 + rng.normal(0, 0.03, (5, 6)) for s in "ABC"}
    one, two = compare_seeds(_runs(diffs), n_resamples=3000), compare_seeds(_runs(diffs), n_resamples=3000)
    assert (one.low, one.high) == (two.low, two.high) and one.low < one.mean < one.high


def test_a_cell_with_two_seeds_shows_its_seed_values_and_no_interval():
    result = compare_seeds(_runs({"A": np.array([[0.05, 0.05], [0.03, 0.03]])}), n_resamples=200)
    assert result.low is None and result.p is None and result.flip_p is None
    assert result.format() == "+0.040 (2 seeds: +0.050, +0.030)"


def test_seeds_of_one_site_must_score_the_same_cases():
    runs = {"A": {0: (np.ones(3), np.ones(3)), 1: (np.ones(2), np.ones(2))}}
    with pytest.raises(ValueError, match="different numbers of cases"):
        compare_seeds(runs)


# -- the sign-flip check -------------------------------------------------------------------------------------------


def test_sign_flip_floor_is_two_over_two_to_the_seeds():
    assert sign_flip_test([0.1, 0.2, 0.3]) == PValue(0.25, "exact")
    assert sign_flip_test([0.1, 0.2, 0.3, 0.4, 0.5]) == PValue(2 / 32, "exact")
    few = sign_flip_test([0.1] * 5, exact_up_to=2, n_resamples=20_000)
    assert few.kind == "monte-carlo" and few.value == pytest.approx(2 / 32, abs=0.01)
    many = sign_flip_test([0.1] * 40, n_resamples=1000)
    assert many == PValue(1 / 1000, "bound", 1000) and many.format() == "< 0.001"


# -- power ---------------------------------------------------------------------------------------------------------


def test_minimum_detectable_difference_is_the_t_test_over_the_seeds():
    # 5 seeds, SD 0.05: df 4, t_0.975 = 2.7764, t_0.8 = 0.9410 -> 3.7174 * 0.05 / sqrt(5) = 0.0831
    assert minimum_detectable_difference(0.05, 5) == pytest.approx(0.0831, abs=1e-4)
    assert minimum_detectable_difference(0.05, 1) is None
    needed = seeds_needed(0.02)
    assert minimum_detectable_difference(0.02, needed) <= 0.01 < minimum_detectable_difference(0.02, needed - 1)


def test_a_large_consistent_difference_over_sites_is_resolved_at_five_seeds():
    rng = np.random.default_rng(0)
    diffs = {s: 0.1 + rng.normal(0, 0.01, (5, 6)) for s in "ABCD"}
    result = compare_seeds(_runs(diffs), n_resamples=2000)
    assert result.p.kind == "t" and result.p.value < 1e-4 and result.flip_p.value == pytest.approx(2 / 32)
    assert result.low > 0 and result.resolved() and result.sites_ahead == 4
    assert json.loads(json.dumps(result.to_dict()))["n_seeds"] == 5


# -- Holm ----------------------------------------------------------------------------------------------------------


def test_holm_hand_worked_example():
    # sorted 0.01, 0.03, 0.04 -> 3 * 0.01 = 0.03, max(0.03, 2 * 0.03) = 0.06, max(0.06, 1 * 0.04) = 0.06
    adjusted = holm({"a": PValue(0.01, "t"), "b": PValue(0.04, "t"), "c": PValue(0.03, "t")})
    assert {k: v.value for k, v in adjusted.items()} == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06})
    assert holm({"a": PValue(0.6, "t"), "b": PValue(0.7, "t")})["a"].value == 1.0


def test_holm_counts_the_family_members_not_yet_tested_as_not_rejected():
    # family of 3, one untested (p = 1, last): 3 * 0.01 = 0.03, max(0.03, 2 * 0.04) = 0.08; the untested one is not
    # returned. With the family left out, the two given are the family: 2 * 0.01, max(0.02, 1 * 0.04).
    adjusted = holm({"a": PValue(0.01, "t"), "b": PValue(0.04, "t")}, family=3)
    assert {k: v.value for k, v in adjusted.items()} == pytest.approx({"a": 0.03, "b": 0.08})
    assert holm({"a": PValue(0.01, "t"), "b": PValue(0.04, "t")})["b"].value == pytest.approx(0.04)
    assert holm({"a": PValue(0.3, "t")}, family=2)["a"].value == pytest.approx(0.6)
    with pytest.raises(ValueError, match="family of 1 cannot hold the 2"):
        holm({"a": PValue(0.01, "t"), "b": PValue(0.04, "t")}, family=1)


def test_holm_keeps_a_bound_a_bound():
    adjusted = holm({"a": PValue(1e-4, "bound", 10_000), "b": PValue(0.2, "exact")})
    assert adjusted["a"].kind == "bound" and adjusted["a"].value == pytest.approx(2e-4)
    assert adjusted["a"].format() == "< 0.0002"
    with pytest.raises(ValueError, match="'a'"):
        holm({"a": 0.5})
